#!/usr/bin/env python3
"""Expected chat prompts for tests/test_chat_template.cc, rendered by Jinja2 from published templates.

Writes rendered.json beside this script: conversations, and for each template, conversation and
switch the prompt text Jinja2 renders (or that the template raised). Rendering is done the way
Hugging Face's apply_chat_template does it: jinja2's ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, raise_exception, and extra keyword arguments (enable_thinking) passed as template
variables, as llama-server's chat_template_kwargs are.

Templates (published by the model makers):
  $TOWERS_SHARED/reference/templates/  (default: ../shared beside the checkout; llama.cpp's copies)
    google-gemma-2-2b-it.jinja, microsoft-Phi-3.5-mini-instruct.jinja,
    mistralai-Mistral-Nemo-Instruct-2407.jinja
  this directory (not in shared/; from llama.cpp's models/templates, which copies them from the
  models' tokenizer_config.json; Apache-2.0):
    Qwen-Qwen3-0.6B.jinja (Qwen/Qwen3-0.6B; Qwen3 dense and MoE models share it),
    mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja (Mistral's v7-tekken format; its default
    system message holds today's date: strftime_now is fixed to 2026-01-01 here),
    google-gemma-3-4b-it.jinja (Gemma 3's, as a public test script quotes google/gemma-3-4b-it's
    tokenizer_config.json; not from Google's repository itself: a system message becomes the first user
    turn's prefix, which is how our gemma format folds it for Gemma 2 as well)

Run: python3 tests/reference/templates/render.py   (needs python3-jinja2)
"""
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("TOWERS_SHARED") or os.path.join(HERE, "..", "..", "..", "..", "shared")

# family (engine/text/chat_template.h name) → template file, where it is, bos, eos.
TEMPLATES = [
    ("gemma", "google-gemma-2-2b-it.jinja", "shared", "<bos>", "<eos>"),
    ("gemma", "google-gemma-3-4b-it.jinja", "here", "<bos>", "<eos>"),
    ("phi3", "microsoft-Phi-3.5-mini-instruct.jinja", "shared", "<s>", "<|endoftext|>"),
    ("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "shared", "<s>", "</s>"),
    ("qwen3", "Qwen-Qwen3-0.6B.jinja", "here", "", "<|im_end|>"),
    ("mistral-v7", "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja", "here", "<s>", "</s>"),
]

THINK = "<think>\nAdd the numbers.\n</think>\n\n4"
CONVERSATIONS = {
    "full": [["system", "You are a helpful assistant"], ["user", "Hello"], ["assistant", "Hi there"],
             ["user", "Who are you"], ["assistant", "   I am an assistant   "], ["user", "Another question"]],
    "nosys": [["user", "Hello"], ["assistant", "Hi there"], ["user", "Who are you"],
              ["assistant", "   I am an assistant   "], ["user", "Another question"]],
    "one": [["user", "  Hi!\n"]],
    "sys_one": [["system", "Be brief."], ["user", "What is 2+2?"]],
    "ws": [["system", " \u00a0Be brief.\u3000"], ["user", "\u2003What?\u00a0\n"]],
    "empty_sys": [["system", ""], ["user", "Hi"]],
    "user_user": [["user", "a"], ["user", "b"]],
    "assistant_first": [["assistant", "a"], ["user", "b"]],
    "sys_late": [["user", "a"], ["assistant", "b"], ["system", "c"], ["user", "d"]],
    # Qwen3: reasoning in the history is dropped; after the last user message it is kept.
    "think": [["user", "What is 2+2?"], ["assistant", THINK], ["user", "And 3+3?"]],
    "think_sys": [["system", "Think step by step."], ["user", "What is 2+2?"], ["assistant", THINK],
                  ["user", "And 3+3?"]],
    "think_last": [["user", "What is 2+2?"], ["assistant", THINK]],
    "think_odd": [["user", "q"], ["assistant", "pre<think>a</think>mid</think>\n\n\npost"], ["user", "r"]],
    "think_unclosed": [["user", "q"], ["assistant", "<think>never closed"], ["user", "r"]],
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def render(source, messages, bos, eos, add_generation_prompt, extra):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "2026-01-01"
    tmpl = env.from_string(source)
    return tmpl.render(messages=[{"role": r, "content": c} for r, c in messages], bos_token=bos, eos_token=eos,
                       add_generation_prompt=add_generation_prompt, **extra)


def main():
    cases = []
    for family, name, where, bos, eos in TEMPLATES:
        path = os.path.join(SHARED, "reference", "templates", name) if where == "shared" else os.path.join(HERE, name)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                for thinking in ((True, False) if family == "qwen3" else (True,)):
                    extra = {} if thinking else {"enable_thinking": False}
                    case = {"family": family, "template": name, "conversation": conv, "add_generation_prompt": gen,
                            "enable_thinking": thinking, "bos": bos, "eos": eos}
                    try:
                        case["expected"] = render(source, messages, bos, eos, gen, extra)
                    except jinja2.exceptions.TemplateError as e:
                        case["error"] = str(e)
                    cases.append(case)
    out = {"jinja2": jinja2.__version__, "conversations": CONVERSATIONS, "cases": cases}
    path = os.path.join(HERE, "rendered.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} renderings ({sum('error' in c for c in cases)} raised)")


if __name__ == "__main__":
    main()
