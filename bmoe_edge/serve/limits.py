"""What one request may ask of the server, declared once: past any of these it is a 4xx that names the limit,
decided before anything is queued. Each bounds a cost the request would otherwise set: memory held while it
waits, the event loop's or the engine thread's time, a native converter's (common's JSON-schema -> grammar is
O(n^3) in an object's optional properties), or llama.cpp's own refusals (its grammar parser's repetition
threshold) met late, on the engine thread."""

from __future__ import annotations

from bmoe_edge.engine.serve_options import BY_NAME as _OPTION

# The body
MAX_BODY_BYTES = 4 << 20
MAX_DEPTH = 64            # arrays and objects nested in a body; deeper is a 400, not a recursion in a parser
MAX_JSON_VALUES = 1 << 16  # values in a body: a 4 MiB body of `[{},{},...]` would be ~1.4 M objects (~74 MB)
BODY_TIMEOUT_S = float(_OPTION["body_timeout"].default)  # type: ignore[arg-type]  # serve's --body-timeout

# Parameters (params.py's rows take their bounds from here)
MAX_TOKENS = 1 << 20
MAX_STOPS = 4
MAX_STOP_CHARS = 256      # each stop string; matching is linear in the text, but held-back text is not free
MAX_BIASES = 1024         # logit_bias entries
MAX_TOP_LOGPROBS = 20     # as OpenAI's chat (its completions stop at 5)
MAX_TOOLS = 64

# The Responses API's previous_response_id: the conversations kept in memory for the server's life, each API key
# an equal share of these (its own oldest go first), never another key's
MAX_STORED_RESPONSES = 256
MAX_STORED_RESPONSE_BYTES = 32 << 20

# A JSON schema (response_format, each tool's parameters): its converted grammar stays small and quick
MAX_SCHEMA_BYTES = 64 << 10
MAX_SCHEMA_PROPERTIES = 128    # in one object: the converter's cost grows as the cube of its optional ones
MAX_SCHEMA_NODES = 4096        # objects, arrays and values in all of a request's schemas
MAX_SCHEMA_ENUM = 512          # entries of one enum
# llama.cpp's grammar parser refuses a repetition over 2,000 (llama-grammar.cpp, MAX_REPETITION_THRESHOLD):
# a count keyword or a pattern's {n,m} past it is refused here, before any conversion
MAX_REPETITION = 2000
PREPARE_DEADLINE_S = 10.0      # rendering, converting and tokenizing one request, off the event loop

# Scoring (completions' echo with logprobs): a teacher-forced pass over the prompt, cancellable between chunks
MAX_SCORED_TOKENS = 4096
