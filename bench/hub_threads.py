"""`bench/e2e_latency.py` with the hub's CPU split between its event loop and the rest.

Takes e2e_latency's arguments and prints its JSON, with two more figures in
`cpu_ms_per_workload`: `hub.main`, the hub's main thread (the event loop: NATS, handlers, the
scheduling cycle), and `hub.other`, every other thread of the hub (the store's, the API's),
from psutil's per-thread CPU times sampled where e2e_latency samples the processes.

    .venv/bin/python bench/hub_threads.py --rate 400 --count 12000
    .venv/bin/python bench/hub_threads.py --bulk 10000
"""

from __future__ import annotations

import e2e_latency

_sample = e2e_latency.Probe.sample


def sample(self: e2e_latency.Probe) -> dict[str, float]:
    out = _sample(self)
    hub = self.procs["hub"]
    main = next((t for t in hub.threads() if t.id == hub.pid), None)
    out["hub.main"] = main.user_time + main.system_time if main is not None else 0.0
    out["hub.other"] = out["hub"] - out["hub.main"]
    return out


if __name__ == "__main__":
    e2e_latency.Probe.sample = sample  # type: ignore[method-assign]
    e2e_latency.main()
