"""Engine service: one llama.cpp context per host; streams grammar-constrained tool arguments."""
