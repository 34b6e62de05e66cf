"""LLM interface, shipped fakes and (optional) real providers."""

from debatebus.llm.base import LLM, LLMRequest, LLMResponse, Message, model_name
from debatebus.llm.fakes import FunctionLLM, ScriptedLLM

__all__ = ["LLM", "FunctionLLM", "LLMRequest", "LLMResponse", "Message", "ScriptedLLM", "model_name"]
