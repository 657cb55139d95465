"""What a router is and what it can see of the cluster: the routing interface (`interface`: Router, ClusterView,
PrefixState), router specs and the scenario's `router:` section (`spec`), the knobs a search may turn (`knobs`), and
the mechanisms a router picks by option rather than code of its own: prefix state (exact peeks, an index fed by the
engines' KV events with lag and loss, or the router's own routing history), load (scraped engine metrics) and router
replicas."""
