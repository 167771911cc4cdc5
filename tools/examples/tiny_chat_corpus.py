"""The text examples/tiny-chat was trained on: short conversations about attention, each
turn one line ("user: ...", "assistant: ..."), written out as the folder's chat template
renders them, so that the model learns the template's format and ends its answer with
a newline (its end-of-sequence token). Deterministic: python3 tiny_chat_corpus.py OUT."""

import random
import sys

FACTS = [
    (["what is attention?", "what does attention do?", "explain attention."],
     "attention mixes the values, weighted by how well each key matches the query."),
    (["what are q, k and v?", "what are queries, keys and values?", "what is qkv?"],
     "three projections of the same tokens: the query asks, the key is matched, the value is mixed."),
    (["why divide by the square root of d_k?", "why scale the scores?", "what does sqrt d_k do?"],
     "it keeps the scores small, so the softmax does not saturate and the gradients stay alive."),
    (["what is a causal mask?", "why mask the future?", "what does the causal mask do?"],
     "it hides the later tokens, so each token only sees the ones before it."),
    (["what is a padding mask?", "why mask the padding?", "what does the padding mask do?"],
     "it hides the pad tokens, so the short rows of a batch attend to real tokens only."),
    (["what is self-attention?", "explain self-attention.", "what is self attention?"],
     "the queries, keys and values all come from the same sequence."),
    (["what is cross-attention?", "explain cross-attention.", "what is cross attention?"],
     "the decoder's queries attend over the encoder's keys and values."),
    (["why did attention replace the rnn?", "why not an rnn?", "what was wrong with rnns?"],
     "an rnn reads one token at a time; attention sees every token at once and in parallel."),
    (["why does self-attention lose order?", "does attention know word order?", "what is permutation equivariance?"],
     "without positions, shuffling the tokens only shuffles the outputs: the order is lost."),
    (["what is a position encoding?", "how does the model know the order?", "what are position encodings?"],
     "a signal added to each token that says where it stands, such as sines or rope."),
    (["what is multi-head attention?", "why several heads?", "what are heads?"],
     "several attentions side by side, each free to look for a different pattern."),
    (["what is the residual connection?", "why residuals?", "what does the residual do?"],
     "it adds the input back to the output, so deep stacks still train."),
    (["what is the ffn?", "what does the feed-forward block do?", "what is the mlp?"],
     "a small network applied to each token on its own, after attention."),
    (["what is layer norm?", "why normalize?", "what does the norm do?"],
     "it rescales each token's vector, which keeps the stack stable."),
    (["what is softmax?", "what does the softmax do?", "why softmax?"],
     "it turns the scores into weights that are positive and sum to one."),
    (["hello", "hi", "hi there"],
     "hello! ask me about attention."),
    (["who are you?", "what are you?", "what is your name?"],
     "a tiny model that qkv trained on a page about attention."),
    (["thank you", "thanks", "thanks!"],
     "you are welcome."),
]


def turn(role, text):
    return f"{role}: {text}\n"


def main(out):
    rng = random.Random(0)
    lines = []
    for _ in range(4000):
        # one to three exchanges a conversation, some after a system line
        convo = []
        if rng.random() < 0.2:
            convo.append(turn("system", "answer in one short line."))
        for _ in range(rng.randint(1, 3)):
            questions, answer = rng.choice(FACTS)
            convo.append(turn("user", rng.choice(questions)))
            convo.append(turn("assistant", answer))
        lines.append("".join(convo))
    with open(out, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
