"""Step time from the model and the hardware: the scenario's `model:` and `time_model:` sections (`spec`), the fitted
linear step-time model (`linear`), the roofline model (`roofline`) over architectures (`architecture`) and hardware
profiles (`hardware`, data in hardware.yaml), the one factory from spec to model (`build`), and the shipped model
configs (`models/`)."""
