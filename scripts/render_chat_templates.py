"""Render every episode of a run through real models' chat templates (not run in CI).

The suite renders each stored episode through a ChatML-with-tools template of its own
(tests/analysis/chatml_tools.jinja). This script does the same with the templates real models
ship, as llama.cpp vendors them (Qwen2.5, Qwen3, Llama 3.x, Hermes, Mistral, Granite, ...),
rendered the way `transformers.apply_chat_template` renders them: a sandboxed Jinja
environment with trim_blocks / lstrip_blocks, `raise_exception`, `strftime_now`, and a
`tojson` that keeps non-ASCII text. Tool-call arguments are passed as objects
(`template_messages(..., parse_arguments=True)`), which these templates `tojson`.

    # the templates: the llama.cpp source inside the llama-cpp-python sdist
    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llama
    tar xzf /tmp/llama/llama_cpp_python-*.tar.gz -C /tmp/llama
    .venv/bin/python scripts/render_chat_templates.py runs/demo \
        /tmp/llama/llama_cpp_python-*/vendor/llama.cpp/models/templates

Per template: how many episodes rendered, and how many of those show every tool name, the
system prompt, every call's function name and every tool result's text; how many the
template refused by its own rule (`raise_exception`: Llama 3.x takes one call per turn)
and the first such message. Exit code 1 when a rendering misses part of an episode or a
template fails for any other reason.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector.analysis.tables import load_run
from collector.record.chat import template_messages, template_tools

#: Tool-calling templates that take the OpenAI chat shape as is (the issue names Qwen2.5 and Llama 3.x).
DEFAULT = (
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "ibm-granite-granite-3.3-2B-Instruct",
)
# Not in DEFAULT, by their own rules (try them with --only): Mistral Nemo wants 9-character
# alphanumeric call ids and shows the system prompt only beside the last user turn;
# SmolLM3 reads `xml_tools`, not `tools`.


def environment() -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: dt.datetime.now().strftime(fmt)
    return env


def shows_everything(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
    """True when the rendering holds every tool name, the system prompt, every call and result."""
    wanted = [t["function"]["name"] for t in tools]
    for m in messages:
        if m["role"] in ("system", "tool") and m["content"]:
            wanted.append(m["content"])
        wanted.extend(c["function"]["name"] for c in m.get("tool_calls", []))
    # Llama 3.x `tojson`s every tool result (a string is iterable in Jinja): look for either form.
    return all(w in text or json.dumps(w)[1:-1] in text for w in wanted)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("templates", type=Path, help="llama.cpp's models/templates directory")
    parser.add_argument("--only", nargs="*", default=list(DEFAULT), help="template names (file stems)")
    args = parser.parse_args(argv)

    rows = load_run(args.run_dir, columns=["episode_id", "stop_reason", "chat", "tools"]).to_pylist()
    reasons: dict[str, int] = {}
    for r in rows:
        reasons[r["stop_reason"]] = reasons.get(r["stop_reason"], 0) + 1
    mix = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    print(f"{args.run_dir}: {len(rows)} episodes ({mix})")
    env = environment()
    failed = False
    for name in args.only:
        path = args.templates / f"{name}.jinja"
        template = env.from_string(path.read_text())
        rendered = complete = refused = 0
        first_error = ""
        for row in rows:
            messages = template_messages(row["chat"], parse_arguments=True)
            tools = template_tools(row["tools"])
            try:
                text = template.render(messages=messages, tools=tools, add_generation_prompt=False,
                                       bos_token="<s>", eos_token="</s>")
            except Exception as e:  # noqa: BLE001 - a template's refusal is what we report
                first_error = first_error or f"{row['episode_id']}: {type(e).__name__}: {e}"
                # raise_exception() is the template's own rule about what it accepts.
                refused += type(e).__name__ == "TemplateError"
                continue
            rendered += 1
            complete += shows_everything(text, messages, tools)
        ok = complete == rendered and rendered + refused == len(rows)
        failed |= not ok
        line = f"{'ok  ' if ok else 'FAIL'} {name}: rendered {rendered}/{len(rows)}, complete {complete}"
        if refused:
            line += f", refused by the template {refused}"
        print(line + (f"; first error {first_error}" if first_error else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
