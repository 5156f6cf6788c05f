#!/bin/bash
mkdir -p /logs/verifier
grep -q hello /app/hello.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
