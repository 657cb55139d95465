"""The cluster: devices and their time sharing, workers (an engine's step loop on a device), the cluster that routes
and delivers requests, how requests are sent (arrivals), the routing interface and the step-time model."""
