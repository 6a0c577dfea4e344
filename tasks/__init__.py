"""Coding tasks: the on-disk pool, task images, and the grader that cannot be fooled.

Above ``sandbox`` (the grader and the image build run commands in sandboxes), below
``rollouts``. ``docs/tasks.md`` tells the whole story; the modules:

    spec            task.json (strict) and the loaded ``Task``
    pool            a pool of task directories; a bad one never blocks the others
    images          ``build_image``: the one-commit workspace, the hidden history, setup, cache
    toolchain       the packaged grading toolchain (system python3 + pytest, mounted)
    workspaces      a trial's overlay workspace; the agent's final tree, without its .git
    test_paths      undo the agent's edits and additions under ``test_paths``
    grading         ``grade``: fresh workspace, real history, tests.patch, no network, reward
    swebench_rules  SWE-bench's pytest parser and resolution rule, without its Docker harness
    validate        reference patch must resolve, empty patch must not; verdicts remembered
    swebench_import SWE-bench instances -> a pool
    events          ``DefenseEvent``: what the defenses did, for the finish body
    git, patches, sandboxing   hardened host git, what a diff touches, the sandbox user
"""
