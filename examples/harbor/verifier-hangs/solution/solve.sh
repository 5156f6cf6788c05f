#!/bin/bash
echo waiting > /app/wait.txt
echo yes > /app/done.txt
