#!/usr/bin/env bash
# On the GPU host: wait up to $1 seconds for every examples/email_agent.py run (and art_e_seeds.sh's chain of seeds)
# to end, then put the reports and the run logs under $OUT (the device tool brings them back).
#   usage: bash evals/device/collect.sh SECONDS
end=$((SECONDS+$1))
source "$(dirname "$0")/chain.sh"  # art_e_seeds.sh's chain: $marker, chain_alive
running() { pgrep -f examples/email_agent.py > /dev/null || chain_alive; }
while [ $SECONDS -lt $end ] && running; do sleep 10; done
for f in /tmp/run-*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E "^step [0-9]+: reward|Error|error:" | tail -6; done
tar czf "$OUT/report.tgz" -C /tmp report 2>/dev/null
tar czf "$OUT/logs.tgz" /tmp/run-*.log 2>/dev/null
echo "still running: $(pgrep -f examples/email_agent.py | wc -l)$(chain_alive && echo ', the seed chain too')"
