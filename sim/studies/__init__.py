"""Studies built from many runs: sweeps, capacity plans, router tuning (search spaces and the search), calibration
of the time model, validation against measured runs, the measured reference, and the analytic models used to screen
before simulating."""
