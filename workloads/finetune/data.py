"""Function-calling data in the Glaive format: generated offline, or read from a local JSONL file.

The Glaive function-calling data (glaive-function-calling-v2) is one JSON object per line with two
strings: ``system`` (the assistant's instructions and the JSON schema of the functions it may call)
and ``chat`` (``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` turns, the call written as
``<functioncall> {"name": ..., "arguments": '{...}'}``). ``generate`` makes records of that shape
from a seed, so the LoRA test needs nothing from the network; ``read_jsonl`` reads and checks a
real file, naming the line and key at fault.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EOT = "<|endoftext|>"
SYSTEM_PREFIX = ("SYSTEM: You are a helpful assistant with access to the following functions. "
                 "Use them if required -\n")
REQUIRED_KEYS = ("system", "chat")


class DataFormatError(ValueError):
    """A dataset file is not in the Glaive function-calling format; the message names path and line."""


@dataclass(frozen=True, slots=True)
class Function:
    """One callable function: its schema, how users ask for it, and what it answers."""

    name: str
    description: str
    parameters: dict[str, tuple[str, str]]
    """Parameter name -> (JSON type, description); all are required."""
    requests: tuple[str, ...]
    """User request templates; ``{param}`` placeholders take the argument values."""
    answer: str
    """The assistant's closing sentence after the function response; placeholders as above."""
    draw: Callable[[random.Random], dict[str, Any]]
    respond: Callable[[dict[str, Any]], dict[str, Any]]

    def schema(self) -> dict[str, Any]:
        props = {k: {"type": t, "description": d} for k, (t, d) in self.parameters.items()}
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": props, "required": list(self.parameters)}}


CITIES = ("Paris", "London", "Tokyo", "New York", "Berlin", "Sydney", "Madrid", "Toronto", "Cairo", "Mumbai",
          "Seoul", "Rome", "Lisbon", "Oslo", "Chicago", "Nairobi")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR")
SYMBOLS = ("AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "TSLA", "META", "IBM")
LANGUAGES = ("English", "French", "Spanish", "German", "Italian", "Japanese")
PHRASES = ("good morning", "where is the station", "thank you very much", "see you tomorrow",
           "how much does it cost", "I love this city")
INGREDIENTS = ("chicken", "rice", "tomato", "garlic", "basil", "cheese", "pasta", "beans", "onion", "egg")
PEOPLE = ("alice", "bob", "carol", "dave", "erin", "frank")
TOPICS = ("the meeting", "the report", "lunch", "the budget", "the trip", "the launch")
MOVIES = ("Inception", "The Matrix", "Alien", "Heat", "Up", "Jaws", "Arrival", "Memento")


def _money(rng: random.Random) -> float:
    return round(rng.uniform(5, 500), 2)


FUNCTIONS: tuple[Function, ...] = (
    Function("get_current_weather", "Get the current weather in a location",
             {"location": ("string", "The city"), "unit": ("string", "celsius or fahrenheit")},
             ("What is the weather like in {location} in {unit}?", "Can you tell me the weather in {location}? "
              "Use {unit} please.", "How warm is it in {location} right now, in {unit}?"),
             "It is currently {temperature} degrees {unit} in {location}.",
             lambda r: {"location": r.choice(CITIES), "unit": r.choice(("celsius", "fahrenheit"))},
             lambda a: {"temperature": len(a["location"]) * 3 + (40 if a["unit"] == "fahrenheit" else 0)}),
    Function("convert_currency", "Convert an amount from one currency to another",
             {"amount": ("number", "The amount to convert"), "from_currency": ("string", "The currency to "
              "convert from"), "to_currency": ("string", "The currency to convert to")},
             ("Can you convert {amount} {from_currency} to {to_currency}?", "How much is {amount} "
              "{from_currency} in {to_currency}?", "I need {amount} {from_currency} converted into {to_currency}."),
             "{amount} {from_currency} is about {converted_amount} {to_currency}.",
             lambda r: dict(zip(("amount", "from_currency", "to_currency"),
                                (_money(r), *r.sample(CURRENCIES, 2)), strict=True)),
             lambda a: {"converted_amount": round(a["amount"] * 0.9, 2)}),
    Function("get_stock_price", "Get the current stock price of a company",
             {"symbol": ("string", "The stock symbol")},
             ("What is the current price of {symbol}?", "Can you get me the stock price of {symbol}?",
              "How is {symbol} trading today?"),
             "The current price of {symbol} is {price} dollars.",
             lambda r: {"symbol": r.choice(SYMBOLS)},
             lambda a: {"price": 100 + 7 * len(a["symbol"]) + 0.25}),
    Function("calculate_tip", "Calculate the tip for a bill",
             {"bill_amount": ("number", "The total bill"), "tip_percentage": ("number", "The tip percentage")},
             ("My bill is {bill_amount} dollars, how much is a {tip_percentage} percent tip?", "What tip should "
              "I leave on {bill_amount} at {tip_percentage} percent?"),
             "A {tip_percentage} percent tip on {bill_amount} is {tip_amount}.",
             lambda r: {"bill_amount": _money(r), "tip_percentage": r.choice((10, 15, 18, 20, 25))},
             lambda a: {"tip_amount": round(a["bill_amount"] * a["tip_percentage"] / 100, 2)}),
    Function("translate_text", "Translate a text from one language to another",
             {"text": ("string", "The text to translate"), "source_language": ("string", "The language of "
              "the text"), "target_language": ("string", "The language to translate to")},
             ("Please translate '{text}' from {source_language} to {target_language}.", "How do you say "
              "'{text}' in {target_language}? It is {source_language}."),
             "Here is '{text}' in {target_language}: {translated_text}.",
             lambda r: dict(zip(("text", "source_language", "target_language"),
                                (r.choice(PHRASES), *r.sample(LANGUAGES, 2)), strict=True)),
             lambda a: {"translated_text": a["text"].upper()}),
    Function("search_recipes", "Search for recipes by ingredients",
             {"ingredients": ("array", "The ingredients to use")},
             ("I have {ingredients}. What can I cook?", "Find me a recipe with {ingredients}."),
             "You could make {recipe} with {ingredients}.",
             lambda r: {"ingredients": r.sample(INGREDIENTS, r.randint(1, 3))},
             lambda a: {"recipe": " and ".join(a["ingredients"]) + " bake"}),
    Function("send_email", "Send an email to a recipient",
             {"recipient": ("string", "The email address"), "subject": ("string", "The subject"),
              "message": ("string", "The body of the email")},
             ("Send an email to {recipient} about {subject} saying {message}.", "Please email {recipient} "
              "with the subject {subject}: {message}."),
             "I have sent the email about {subject} to {recipient}.",
             lambda r: {"recipient": r.choice(PEOPLE) + "@example.com", "subject": r.choice(TOPICS),
                        "message": r.choice(("see you at noon", "it is done", "please call me", "all good"))},
             lambda a: {"status": "sent"}),
    Function("get_movie_details", "Get details of a movie",
             {"title": ("string", "The title of the movie"), "year": ("integer", "The release year")},
             ("Tell me about the movie {title} from {year}.", "What do you know about {title} ({year})?"),
             "{title} ({year}) is rated {rating} out of 10.",
             lambda r: {"title": r.choice(MOVIES), "year": r.randint(1975, 2020)},
             lambda a: {"rating": round(5 + (a["year"] % 50) / 10, 1)}),
)


def _fill(template: str, values: dict[str, Any]) -> str:
    shown = {k: " and ".join(v) if isinstance(v, list) else v for k, v in values.items()}
    return template.format(**shown)


def make_record(rng: random.Random) -> dict[str, str]:
    """One Glaive-style record: 1-3 function schemas offered, one called with arguments from the request."""
    offered = rng.sample(FUNCTIONS, rng.randint(1, 3))
    fn = offered[0]
    rng.shuffle(offered)
    system = SYSTEM_PREFIX + "\n\n".join(json.dumps(f.schema(), indent=4) for f in offered) + "\n"
    args = fn.draw(rng)
    call = json.dumps({"name": fn.name, "arguments": "ARGS"}).replace('"ARGS"', "'" + json.dumps(args) + "'")
    chat = f"USER: {_fill(rng.choice(fn.requests), args)}\n\n\nASSISTANT: <functioncall> {call} {EOT}\n\n\n"
    if rng.random() < 0.5:
        response = fn.respond(args)
        chat += (f"FUNCTION RESPONSE: {json.dumps(response)}\n\n\n"
                 f"ASSISTANT: {_fill(fn.answer, {**args, **response})} {EOT}\n\n\n")
    return {"system": system, "chat": chat}


def generate(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` records, the same for the same seed on every rank, host and Python version."""
    rng = random.Random(seed)
    return [make_record(rng) for _ in range(count)]


def write_jsonl(records: list[dict[str, str]], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def check_record(record: Any, where: str) -> dict[str, str]:
    """A record as the trainer needs it, or DataFormatError naming ``where`` and the key at fault."""
    fmt = "expected one JSON object per line with string keys 'system' and 'chat' (Glaive function-calling format)"
    if not isinstance(record, dict):
        raise DataFormatError(f"{where}: got a JSON {type(record).__name__}, {fmt}")
    for key in REQUIRED_KEYS:
        if key not in record:
            raise DataFormatError(f"{where}: missing key {key!r} (has {sorted(record)}); {fmt}")
        if not isinstance(record[key], str):
            raise DataFormatError(f"{where}: key {key!r} is a {type(record[key]).__name__}, not a string; {fmt}")
    for marker in ("USER:", "ASSISTANT:"):
        if marker not in record["chat"]:
            raise DataFormatError(f"{where}: 'chat' has no {marker!r} turn; {fmt}")
    return {"system": record["system"], "chat": record["chat"]}


def read_jsonl(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    """The first ``limit`` records of a Glaive-format JSONL file, each line checked."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: dataset file not found (a JSONL file in the Glaive function-calling format)")
    records: list[dict[str, str]] = []
    for number, line in _lines(path):
        if limit is not None and len(records) >= limit:
            break
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        records.append(check_record(raw, f"{path}:{number}"))
    if not records:
        raise DataFormatError(f"{path}: no records (the file is empty)")
    return records


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def text_and_spans(record: dict[str, str]) -> tuple[str, list[tuple[int, int]]]:
    """The training text of a record, and the character spans of the assistant's replies.

    A span runs from just after ``ASSISTANT:`` to the end of its ``<|endoftext|>`` (or the end of the
    text): the tokens a function-calling fine-tune learns to produce.
    """
    text = record["system"].rstrip("\n") + "\n\n" + record["chat"]
    spans: list[tuple[int, int]] = []
    start = text.find("ASSISTANT:")
    while start >= 0:
        begin = start + len("ASSISTANT:")
        stop = text.find(EOT, begin)
        end = len(text) if stop < 0 else stop + len(EOT)
        spans.append((begin, end))
        start = text.find("ASSISTANT:", end)
    return text, spans


def pack(records: list[dict[str, str]], tokenizer: Any, seq_len: int) -> tuple[Any, Any]:
    """Tokenise records end to end (an EOS after each) and cut the stream into ``seq_len`` blocks.

    Returns ``(input_ids, assistant)``: int64 and bool tensors of shape (blocks, seq_len), where
    ``assistant`` marks the tokens inside an assistant reply. Packing wastes no token on padding,
    so tokens/s counts only real text. The tokenizer must be a fast one (it gives character offsets).
    """
    import torch

    pairs = [text_and_spans(r) for r in records]
    enc = tokenizer([text for text, _ in pairs], return_offsets_mapping=True, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    marks: list[bool] = []
    for (_, reply_spans), token_ids, offsets in zip(pairs, enc["input_ids"], enc["offset_mapping"], strict=True):
        ids.extend(token_ids)
        # A token belongs to a reply when its first character does.
        marks.extend(any(s <= begin < e for s, e in reply_spans) for begin, _ in offsets)
        ids.append(eos)
        marks.append(False)
    blocks = len(ids) // seq_len
    if blocks == 0:
        raise DataFormatError(f"{len(records)} records make {len(ids)} tokens, less than one block of "
                              f"seq_len={seq_len}; give more records or a shorter seq_len")
    cut = blocks * seq_len
    return (torch.tensor(ids[:cut], dtype=torch.int64).view(blocks, seq_len),
            torch.tensor(marks[:cut], dtype=torch.bool).view(blocks, seq_len))
