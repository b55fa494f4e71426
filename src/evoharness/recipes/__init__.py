"""Recipes: what a job trains on and how (the ALFWorld and repository RL workloads, the RL loop,
seed soups, the main job's stages). Built on `runtime` and `train`; nothing below imports them."""
