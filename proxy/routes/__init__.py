"""HTTP routes: inference (harness-facing) and control (orchestrator/trainer-facing)."""
