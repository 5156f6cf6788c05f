#!/bin/bash
# Reward 1 when the status file says ready and the script holds the command.
mkdir -p /logs/verifier
grep -q ready /app/out/status.txt && grep -q status.txt /app/setup.sh && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
