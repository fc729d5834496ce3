"""The composition root: the one place that builds a hub, a spoke and a burst controller.

Each piece is built from its settings model (`HubSettings`, `SpokeSettings`, `BurstSettings`)
by `build_*` and run until stopped by `serve_*`:

- `gpufed hub|spoke|burst` call `serve_*` (`gpufed up` runs those commands as processes);
- the test federation (tests/integration/fed.py) and the burst test harness call `build_*` and
  run the pieces as tasks of one event loop;
- the benches run `gpufed up`'s `Federation`, hence these same commands.

One module per piece, so that `gpufed spoke` does not import the hub's web stack.
"""
