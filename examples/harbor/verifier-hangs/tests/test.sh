#!/bin/bash
# A broken verifier: it waits far past its one-second timeout.
sleep 60
mkdir -p /logs/verifier
echo 1 > /logs/verifier/reward.txt
