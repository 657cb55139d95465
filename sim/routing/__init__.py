"""What a router can see of the cluster, as mechanisms a router picks by option rather than code of its own:
prefix state (exact peeks, an index fed by the engines' KV events with lag and loss, or the router's own routing
history), load (scraped engine metrics), router replicas, and the `NAME:key=value` router specs of the CLI."""
