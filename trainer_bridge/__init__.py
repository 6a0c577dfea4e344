"""The trainer side: pulls trajectories, recomputes logprobs with routing replay, updates."""
