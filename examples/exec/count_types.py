#!/usr/bin/env python3
"""A pawl exec handler: events per type, one JSON file per segment, idempotent on redelivery."""
import json, os, sys
path = f"counts-{os.environ['PAWL_PROCESSOR']}-{os.environ['PAWL_SEGMENT']}.json"
state = json.load(open(path)) if os.path.exists(path) else {"last": 0, "types": {}}
for line in iter(sys.stdin.readline, ""):  # not `for line in sys.stdin`: it reads ahead
    ev = json.loads(line)
    if ev["index"] > state["last"]:  # a redelivered event is already counted
        state["types"][ev["type"]] = state["types"].get(ev["type"], 0) + 1
        state["last"] = ev["index"]
    if ev.get("batch_end"):  # make the batch durable, then acknowledge it
        with open(path + ".tmp", "w") as f:
            json.dump(state, f), f.flush(), os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        print("ok", ev["index"], flush=True)
