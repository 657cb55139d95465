"""The cluster: devices and their time sharing (`device`, `host_link`), workers (an engine's step loop on a device,
`worker`), the cluster that routes and delivers requests (`cluster`), how requests are sent (`arrivals`), and the
reuse ledger (`reuse`). The router interface it calls is `sim.routing.interface`; the step-time models are
`sim.timing`'s."""
