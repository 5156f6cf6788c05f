#!/bin/bash
# Reward 1 only for the whole page: a write cut short misses its last words.
mkdir -p /logs/verifier
grep -q "row 13 mike, END" /app/site/index.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
