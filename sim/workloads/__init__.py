"""What is sent: the `Request` value, the shared-prefix workload generator and Mooncake traces."""
