"""What is sent: the `Request` value, the scenario's `workload:` section (`spec`), the shared-prefix workload generator
(`shared_prefix`) and Mooncake traces (`traces`)."""
