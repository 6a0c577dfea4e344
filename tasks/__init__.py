"""Coding tasks: the on-disk pool, task images, and the grader that cannot be fooled.

Above ``sandbox`` (the grader and the image build run commands in sandboxes), below
``rollouts``. Owns the ``POOL/<task_id>/task.json`` format, the cached task image (the
agent's one-commit repository, the real history kept apart), validation (the reference
patch must resolve, the empty patch must not), SWE-bench import, and grading.
"""
