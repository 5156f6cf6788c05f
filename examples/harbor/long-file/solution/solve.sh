#!/bin/bash
mkdir -p /app/site
echo "row 01 alpha, row 02 bravo, row 03 charlie, row 04 delta, row 05 echo, row 06 foxtrot, row 07 golf, row 08 hotel, row 09 india, row 10 juliet, row 11 kilo, row 12 lima, row 13 mike, END" > /app/site/index.txt
