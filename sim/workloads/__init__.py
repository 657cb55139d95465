"""What is sent: the `Request` value, the scenario's `workload:` section (`spec`: shared-prefix; `session_spec`:
sessions), the shared-prefix workload generator (`shared_prefix`), sessions (`sessions`: the protocol; `sequence`: the
token sequence every session request is built from; `session_workload`: chats and agents from a spec) and Mooncake
traces (`traces`)."""
