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

Sessions. A request with a `session_id` is sent by its session's own client: an agent run (a coding agent process
holds its own OpenAI client) or a chat client per user keeps one pool per session, and a session's turns go one after
another, so each turn reuses the connection the last one left idle -- the same pod -- unless it has been idle too
long: the next turn then opens a new connection on a new random pod. Session clients take the same pool rules with
`session_keepalive_expiry_s` (5 s) as their idle limit: httpx closes a connection idle for 5 s (`Limits`
keepalive_expiry 5.0, which the OpenAI client keeps) and vLLM's API server closes it after 5 s too (uvicorn
`timeout_keep_alive` = `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, default 5, `vllm/envs.py`), so a think time or tool call
longer than 5 s moves the session to a random pod. `session_clients=false` sends every request through the one shared
pool instead (a backend that serves many users' sessions through one client). Requests without a session id always
take the shared pool. Subagents are sessions of their own, hence clients of their own here (an agent that shares one
client between parent and subagents would mix their connections; requests do not name their parent).

Membership. A new connection's pod is uniform over the routable pods (kube-proxy's ready endpoints: a terminating pod
is out of the Service, a new one in once ready). A pod that leaves closes its connections: the server of a draining
pod ends keep-alive (uvicorn's graceful shutdown closes idle connections at once and answers in-flight requests with
`Connection: close`), so every pool drops the pod's connections when it leaves and the session's next request opens
a new connection on a random routable pod: sticky sessions re-pick. A request in flight on such a connection still
completes there. Connections already open stay pinned when a pod joins (a new pod gets only new connections).
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
    session_clients: bool = Field(True, description="A request with a session id goes through its session's own "
                                                    "client (pool); false: through the shared pool like the rest.")
    session_keepalive_expiry_s: float | None = Field(5.0, gt=0, description="keepalive_expiry_s of the session "
                                                                            "clients (httpx's 5 s, and vLLM's "
                                                                            "server keep-alive 5 s); null = never.")


@dataclass(slots=True)
class Connection:
    """One pooled connection: the pod it is pinned to, requests outstanding and served, when it last went idle."""

    pod: int
    active_requests: int = 0
    served_requests: int = 0
    idle_since_s: float = 0.0


class ConnectionPool:
    """One client's pooled connections, in the order they were opened (httpcore's); `take` is the module docstring's
    rule. Invariant: a connection is in `connections` from its first request until it closes."""

    def __init__(self) -> None:
        self.connections: list[Connection] = []

    def take(self, router: StickyRouter, now_s: float, keepalive_expiry_s: float | None) -> Connection:
        """The connection the next request goes on (opening one, pinned to a random pod, if the rule says so)."""
        if keepalive_expiry_s is not None:
            self.connections = [c for c in self.connections
                                if c.active_requests or now_s - c.idle_since_s < keepalive_expiry_s]
        idle = next((c for c in self.connections if c.active_requests == 0), None)
        if idle is not None:
            return idle
        if len(self.connections) < router.options.connections:
            connection = Connection(pod=router.new_pod())
            self.connections.append(connection)
            router.connections_opened += 1
            return connection
        return min(self.connections, key=lambda c: c.active_requests)  # first least-busy in pool order

    def release(self, connection: Connection, now_s: float, max_requests: int | None) -> None:
        connection.active_requests -= 1
        if connection.active_requests == 0:
            connection.idle_since_s = now_s
            if (max_requests is not None and connection.served_requests >= max_requests
                    and connection in self.connections):  # not closed already by its pod leaving
                self.connections.remove(connection)

    def close_pods(self, pods: set[int]) -> None:
        """The connections pinned to `pods` close (their pods left)."""
        self.connections = [c for c in self.connections if c.pod not in pods]


class StickyRouter(RouterBase):
    """Keep-alive connections pinned to uniform random pods; requests take their client's oldest idle connection.

    Clients: `shared` (requests without a session, or all with `session_clients=false`) and one pool per session.
    """

    name = "sticky"
    summary = "keep-alive client through a Service: K pooled connections, each pinned to a random pod"
    Options = StickyOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shared = ConnectionPool()
        self.session_pools: dict[int, ConnectionPool] = {}
        self._on: dict[int, tuple[ConnectionPool, Connection]] = {}  # request id -> its client and connection
        self.connections_opened = 0
        """Connections opened so far (each a fresh random pod)."""
        self.ignores_cluster_state = self.options.connections == 0  # a new connection per request reads nothing

    @property
    def pool(self) -> list[Connection]:
        """The shared client's connections, in pool order."""
        return self.shared.connections

    def new_pod(self) -> int:
        """The pod a new connection is pinned to: uniform over the routable pods (`self.rng`; for a fixed fleet the
        draw `randrange(num_workers)` was)."""
        workers = self.workers
        return workers[self.rng.randrange(len(workers))]

    def after_set_workers(self, left, joined, renewed) -> None:
        gone = set(left)
        if not gone:
            return
        self.shared.close_pods(gone)
        for pool in self.session_pools.values():
            pool.close_pods(gone)

    def route(self, request: Request, view: ClusterView) -> int:
        opts = self.options
        if opts.connections == 0:
            return self.new_pod()
        if request.session_id is not None and opts.session_clients:
            client = self.session_pools.setdefault(request.session_id, ConnectionPool())
            expiry = opts.session_keepalive_expiry_s
        else:
            client, expiry = self.shared, opts.keepalive_expiry_s
        connection = client.take(self, view.now_s, expiry)
        self._on[request.request_id] = (client, connection)
        return connection.pod

    def after_dispatch(self, request: Request, worker: int) -> None:
        taken = self._on.get(request.request_id)
        if taken is not None:
            taken[1].active_requests += 1
            taken[1].served_requests += 1

    def after_complete(self, request: Request, worker: int) -> None:
        taken = self._on.pop(request.request_id, None)
        if taken is None:
            return
        client, connection = taken
        client.release(connection, self.view.now_s, self.options.max_requests_per_connection)
        if client is not self.shared and not client.connections \
                and self.session_pools.get(request.session_id) is client:
            # an ended session's client holds nothing; a second request of the session may have ended it already
            del self.session_pools[request.session_id]

    def pods(self) -> list[int]:
        """The pod of each open connection of the shared client, in pool order."""
        return [c.pod for c in self.pool]
