"""The SGLang-compatible local engine: a small PyTorch/transformers model on the CPU.

It speaks SGLang 0.5.23's native HTTP protocol (``engine.server``: ``/generate``;
``engine.control``: aborts, health, ``/server_info``, pause, weight updates from disk;
``engine.distributed``: weights broadcast over a process group) and behaves like
it on every point the proxy depends on (``reference/sglang-audit.md`` item 7): errors in band
when streaming and aborts with SGLang's ``status_code`` (``engine.admission``), over-long
prompts refused rather than clamped, stop string before stop token before length, routed
experts only with ``--enable-return-routed-experts``, seeds only with
``--enable-deterministic-inference``, weight updates that drain running requests and
``weight_versions`` spans (``engine.weights``), aborts by rid prefix, a running-request
timeout that ends in a 503 abort.

Known differences from SGLang 0.5.23:

- Single requests only: batch ``text``/``input_ids`` lists, ``top_logprobs_num`` > 0 and
  ``token_ids_logprob`` are refused with 400 instead of served; input ids outside the
  vocabulary are refused with 400 (SGLang does not check them).
- There is no prefix cache: ``cached_tokens`` is always 0, routing rows are always
  recomputed (SGLang serves cached KV slots' rows) and ``/flush_cache`` only checks that
  nothing is running. There is no KV pool either: ``--max-total-tokens`` only lowers
  ``max_req_input_len``, the way a small pool would.
- Pause modes ``retract`` and ``in_place`` both freeze running requests with their KV cache
  and resume them on ``/continue_generation`` (SGLang's ``retract`` recomputes the KV).
- A client that disconnects mid-stream is aborted at once (SGLang waits about 2 s).
- A failing forward pass ends its request with an in-band ``InternalServerError`` (500);
  in SGLang it would take the scheduler down.
- ``input_token_logprobs`` arrive with the final chunk (SGLang: the first).
- ``/health`` answers 200 once the model is loaded (SGLang: 503 while starting, which the
  engine cannot be asked during, and 503 while shutting down).
- ``/server_info`` carries the subset of SGLang's fields that clients read (limits,
  feature flags, parallelism, versions), not all of ``ServerArgs``.
- Weight-update groups are gloo only (the engine is CPU-only; ``nccl``, SGLang's default
  backend, is refused at once) with one rank per worker (tp 1). An empty group name is a
  400 (SGLang's assertion would stop its scheduler).
- ``/update_weights_from_distributed`` checks every name and shape before it changes
  anything, and refuses names the checkpoint does not have; SGLang's loaders skip unknown
  names silently and may leave the model partly updated (its message, kept here, says so).
- Abort, error and info messages use SGLang's wording where a client may read them.
"""
