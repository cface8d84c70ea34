"""Drafting from everything already said: a suffix index over the prompts and answers a
session or a server has seen, proposing the continuations of the longest matching suffix as
a tree of candidates (SuffixDecoding, Oliaro et al., arXiv 2411.04975; shipped in Snowflake's
Arctic Inference, arctic_inference/suffix_decoding and csrc/suffix_decoding/suffix_tree.cc).

What it follows from SuffixDecoding:
- two indexes consulted each round: the current request's own prompt and answer (`local`)
  and the shared history of earlier requests; the proposal with the higher score wins (the
  local one on a tie: the current request weighs most), as Arctic's `SuffixDecodingCache.
  speculate` compares its per-request and global trees;
- every earlier occurrence of the matched suffix counts, and a node's probability is its
  count over its parent's (occurrences whose document ended at the parent count in the
  parent, so siblings may sum to less than one);
- the tree grows best first by the product of those probabilities along the path (the
  paper's D(N)), stops below `min_prob` (Arctic's `suffix_min_token_prob`, 0.1), and holds at
  most MAX_SPEC = factor x match length + offset nodes (the paper's adaptive MAX_SPEC = alpha
  x p; Arctic's `suffix_max_spec_factor` 1.0 and `suffix_max_spec_offset` 0.0), and at most
  what the caller asks for;
- the score of a tree is the sum of its nodes' path probabilities (the expected accepted
  tokens were the frequencies right); among the match lengths the occurrences allow, the
  best score wins, ties to the longer match (Arctic's `SuffixTree::speculate`).

What it does differently, and why: not a suffix tree. Arctic's tree inserts every suffix up
to depth 64, in C++; in Python a node object per suffix step would cost hundreds of bytes
per token and forgetting old documents would mean walking the tree. Instead:
- the tokens live in one ring buffer (int32), documents one after another, each opened by an
  end marker (-1) so that no match or continuation crosses from one document into another;
  the ring has room for `limit_tokens` slots (a marker takes one), and when it is full the
  oldest documents are forgotten whole (only a single document longer than the limit loses
  its own beginning). The arrays grow by doubling up to the limit and never past it, so a
  long-running server's memory is flat;
- for each n-gram order n in {min_match, powers of two up to max_match}, a hash chain as in
  zlib's deflate: `heads[bucket]` holds the latest position whose n-gram hashes to that
  bucket, `back[slot]` the distance to the previous one (uint32, 0: none). Chains are walked
  newest first and stop at the oldest position kept: eviction is moving one number;
- a query walks the highest order whose n-gram occurred (at most `max_occurrences` steps,
  newest first: a very common suffix is judged on its recent occurrences), measures each
  occurrence's exact match length against the context with one numpy comparison (hash
  collisions fall out there), and builds the trie of what followed the longest ones.

A request's prompt and answer join the history as one document when it ends (a later
request then matches across their border: the chat template's assistant header before an
answer), less what the prompt resends: an agent's prompt begins with its last prompt and
answer, and only what follows them is added (`add_turn`), so a conversation resent turn
after turn neither fills the history nor counts its old turns again.

Memory: 4 bytes per slot for the token, 4 per order for its chain link, and 8 per order per
head bucket (a bucket for every one to two slots): 44 bytes per token of the limit at a power
of two, 46 MB at the default 2**20 (`footprint()`; tests/unit/test_history_index.py holds a long
stream of documents to it with tracemalloc), plus the 4 latest turns kept whole. A query
costs about a hundred microseconds whatever the history's size (docs/results/drafting.md has the
figures): the chain walk and the trie are bounded by `max_occurrences` and the tree's
budget, not by the history.

One index per namespace (`HistoryStore`; the server's: a keyed digest of the API key),
optionally kept on disk as .npz with a format version and a sha256 of its content, refused in
one line when it does not read back whole.

Plain Python and numpy: no MLX. The drafter here proposes point masses, as prompt lookup
does (lookup.py), so the rule's exactness is untouched by anything it proposes.

The modules, by job: hashing.py the n-grams' rolling hashes, index.py the ring and its hash
chains (HistoryIndex), proposals.py the trie grown from a match (Speculation, Proposal),
drafter.py one request's drafter (HistoryDrafter), files.py the file format and how a file
is opened, store.py one index per namespace (HistoryStore).
"""

from .drafter import HistoryDrafter
from .files import FORMAT, read_documents
from .index import DEFAULT_LIMIT_TOKENS, END, MAX_MATCH, MIN_MATCH, HistoryIndex, Match, footprint, orders_for
from .proposals import Proposal, Speculation, grow
from .store import DEFAULT_NAMESPACE, HistoryStore, namespace_of

__all__ = [
    "DEFAULT_LIMIT_TOKENS",
    "DEFAULT_NAMESPACE",
    "END",
    "FORMAT",
    "MAX_MATCH",
    "MIN_MATCH",
    "HistoryDrafter",
    "HistoryIndex",
    "HistoryStore",
    "Match",
    "Proposal",
    "Speculation",
    "footprint",
    "grow",
    "namespace_of",
    "orders_for",
    "read_documents",
]
