"""A keep-alive HTTP client in front of a Kubernetes Service: each pooled connection is pinned to one pod.

kube-proxy (iptables/nftables mode, docs/routers/rules.md, Kubernetes Service) picks a uniformly random endpoint when a TCP connection opens and
conntrack pins it; every request sent on that connection reaches the same pod. The client's connection pool decides
which connection a request takes. The pool modelled is httpcore's (`encode/httpcore`
`httpcore/_async/connection_pool.py` `_assign_requests_to_connections` @9820975), which httpx and therefore the
OpenAI Python client use (`openai/_constants.py`: `httpx.Limits(max_connections=1000, max_keepalive_connections=100)`;
httpx `keepalive_expiry` 5 s):

    pool = connections in the order they were opened (new ones are appended)
    on a request:  drop connections idle for >= keepalive_expiry_s
                   idle = [c in pool if c has no request]
                   if idle:                     c = idle[0]                  # the oldest-opened idle connection
                   elif len(pool) < connections: c = new, pod = U{0..n-1}    # pinned for life (self.rng)
                   else:                        c = the least-busy in pool   # see NOTE
    on completion: the connection is released; after `max_requests_per_connection` requests it closes (the server's
                   keep-alive request limit) and the next request opens a new one on a new random pod.

NOTE: with every connection busy, httpcore queues the request until one is released, and which one (hence which
pod) is decided then. A router must answer now, so the request is sent on the connection with the fewest requests
outstanding (the first such in pool order), as if pipelined. With a closed loop whose concurrency equals
`connections` this never happens: a completion always frees a connection before the next request.

`connections=0` is a new connection per request: a uniform random pod each time, the `random` router (same draws).
httpcore's idle-connection cap (`max_keepalive_connections`) is not modelled: at 100 it is above any pool here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from policies.base import RouterBase, RouterOptions
from sim.routing.interface import ClusterView
from sim.workloads.request import Request


class StickyOptions(RouterOptions):
    connections: int = Field(1000, ge=0, description="Pool size K: most connections the client keeps open (OpenAI "
                                                     "client / httpx max_connections 1000); 0 = a new connection "
                                                     "per request (= random).")
    max_requests_per_connection: int | None = Field(None, ge=1, description="Requests a connection serves before it "
                                                                             "closes (server keep-alive request "
                                                                             "limit, e.g. nginx keepalive_requests); "
                                                                             "null = unlimited.")
    keepalive_expiry_s: float | None = Field(None, gt=0, description="An idle connection older than this is closed "
                                                                     "before the next request (httpx "
                                                                     "keepalive_expiry, 5 s by default there); "
                                                                     "null = never.")


@dataclass(slots=True)
class Connection:
    """One pooled connection: the pod it is pinned to, requests outstanding and served, when it last went idle."""

    pod: int
    active_requests: int = 0
    served_requests: int = 0
    idle_since_s: float = 0.0


class StickyRouter(RouterBase):
    """Keep-alive connections pinned to uniform random pods; requests take the oldest idle connection.

    Invariant: `pool` is in opening order; a connection is in it from its first request until it closes.
    """

    name = "sticky"
    summary = "keep-alive client through a Service: K pooled connections, each pinned to a random pod"
    Options = StickyOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pool: list[Connection] = []
        self._on: dict[int, Connection] = {}  # request id -> the connection carrying it
        self.connections_opened = 0
        """Connections opened so far (each a fresh random pod)."""
        self.ignores_cluster_state = self.options.connections == 0  # a new connection per request reads nothing

    def route(self, request: Request, view: ClusterView) -> int:
        opts = self.options
        if opts.connections == 0:
            return self.rng.randrange(self.num_workers)
        if opts.keepalive_expiry_s is not None:
            self._expire(view.now_s)
        idle = next((c for c in self.pool if c.active_requests == 0), None)
        if idle is not None:
            connection = idle
        elif len(self.pool) < opts.connections:
            connection = Connection(pod=self.rng.randrange(self.num_workers))
            self.pool.append(connection)
            self.connections_opened += 1
        else:
            connection = min(self.pool, key=lambda c: c.active_requests)  # first least-busy in pool order
        self._on[request.request_id] = connection
        return connection.pod

    def _expire(self, now_s: float) -> None:
        expiry = self.options.keepalive_expiry_s
        self.pool = [c for c in self.pool if c.active_requests or now_s - c.idle_since_s < expiry]

    def after_dispatch(self, request: Request, worker: int) -> None:
        connection = self._on.get(request.request_id)
        if connection is not None:
            connection.active_requests += 1
            connection.served_requests += 1

    def after_complete(self, request: Request, worker: int) -> None:
        connection = self._on.pop(request.request_id, None)
        if connection is None:
            return
        connection.active_requests -= 1
        if connection.active_requests == 0 and self.options.keepalive_expiry_s is not None:
            connection.idle_since_s = self.view.now_s
        limit = self.options.max_requests_per_connection
        if limit is not None and connection.served_requests >= limit and connection.active_requests == 0:
            self.pool.remove(connection)

    def pods(self) -> list[int]:
        """The pod of each open connection, in pool order."""
        return [c.pod for c in self.pool]
