#!/bin/bash
mkdir -p /app/out
echo ready > /app/out/status.txt
echo "mkdir -p /app/out && echo ready > /app/out/status.txt" > /app/setup.sh
