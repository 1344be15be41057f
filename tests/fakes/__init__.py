"""Test doubles: the fake NVML library (fake_nvml.c, built by fake_nvml.py) and calls (nvml_api.py), the scripted nvidia-smi."""
