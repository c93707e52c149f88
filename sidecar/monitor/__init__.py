"""The monitor: scraping vLLM, reading NVML, comparing with the prediction and naming what is wrong."""
