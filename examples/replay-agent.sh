#!/usr/bin/env bash
# A stand-in agent for demos and tests: replays a recorded agent stream on stdout, line by line,
# with a short pause per line, while a background "tool" process runs (so stopping the agent has
# a process tree to stop). Usage: replay-agent.sh STREAM.jsonl [SECONDS_PER_LINE]
set -u
stream=${1:?usage: replay-agent.sh STREAM.jsonl [SECONDS_PER_LINE]}
delay=${2:-0.02}
sleep 300 &
while IFS= read -r line || [ -n "$line" ]; do
  printf '%s\n' "$line"
  sleep "$delay"
done < "$stream"
kill %1 2>/dev/null
exit 0
