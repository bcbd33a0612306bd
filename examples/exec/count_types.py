#!/usr/bin/env python3
"""A pawl exec handler: events per type, one JSON file per segment, idempotent on redelivery.

A command that cannot handle an event answers `fail INDEX REASON` (or `poison INDEX REASON`)
instead, then skips the batch's lines up to "batch_end"; with --dead-letter-attempts the event's
stream is parked and `pawl dead-letters` retries it later, as lines with "dead_letter": true.
"""
import json, os, sys
path = f"counts-{os.environ['PAWL_PROCESSOR']}-{os.environ['PAWL_SEGMENT']}.json"
state = json.load(open(path)) if os.path.exists(path) else {"last": 0, "types": {}}
letters = set(state.get("letters", []))
for line in iter(sys.stdin.readline, ""):  # not `for line in sys.stdin`: it reads ahead
    ev = json.loads(line)
    if ev.get("dead_letter"):  # a retried letter lies below "last": count each one once
        new = ev["index"] not in letters
        letters.add(ev["index"])
    else:
        new = ev["index"] > state["last"]  # a redelivered event is already counted
        state["last"] = max(state["last"], ev["index"])
    if new:
        state["types"][ev["type"]] = state["types"].get(ev["type"], 0) + 1
    if ev.get("batch_end"):  # make the batch durable, then acknowledge it
        state["letters"] = sorted(letters)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f), f.flush(), os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        print("ok", ev["index"], flush=True)
