"""Step time from the model and the hardware: architectures (`architecture`), hardware profiles (`hardware`, data in
hardware.yaml), the roofline step-time model (`roofline`), and the shipped model configs (`models/`)."""
