#!/usr/bin/env bash
# Hugging Face folders as transformers 5 saves them, and the config inputs a user gets wrong:
#   (a) config.json's rope_parameters {rope_theta, rope_type} (transformers 5) gives the logits
#       that a top-level rope_theta gives; a rope_type other than default is refused by name;
#       fsdp-export writes both forms;
#   (b) chat_template.jinja (transformers 5) is the chat template; --chat with no template, or a
#       ChatML template whose vocabulary has no <|im_end|>, is refused in words, with no internal
#       check shown; ChatML's words only in a Jinja comment render nothing (the template's own
#       text is the prompt);
#   (c) a JSON field of the wrong type names the file and the field;
#   (d) --resume refuses a changed --rope-theta or --norm-eps, and data changed in the middle.
set -uo pipefail
bin=$(cd "$1" && pwd)  # the examples' directory: fsdp-train, fsdp-generate, fsdp-export
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
cd "$work" || exit 1
head -c 20000 /usr/share/common-licenses/GPL-3 > text.txt
A=(--arch llama --vocab 258 --dim 32 --layers 1 --heads 2 --seq 16 --batch 2 --data text.txt --tokenizer bytes
  --sample-tokens 0 --threads 1 --rope-theta 500000)
"$bin/fsdp-train" "${A[@]}" --steps 2 --ckpt-dir ck --ckpt-every 2 > train.out 2>&1 || bad "training failed: $(tail -3 train.out)"
"$bin/fsdp-export" --ckpt ck --out hf4/model.safetensors > export.out 2>&1 || bad "export failed: $(tail -3 export.out)"

# (a) the exported config.json names rope theta both ways.
python3 - hf4/config.json << 'EOF' && ok || bad "export's config.json: $(cat hf4/config.json)"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["rope_theta"] == 500000 and c["rope_parameters"] == {"rope_theta": 500000, "rope_type": "default"}, c
EOF
# The weights as transformers saves them: no fsdp.config in the header, so config.json is the config.
python3 - hf4/model.safetensors << 'EOF' || bad "stripping fsdp.config failed"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"] = {"format": "pt"}
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
EOF
# A ChatML tokenizer: bytes plus <|im_start|> 256 and <|im_end|> 257; the template in
# tokenizer_config.json (transformers 4) and in chat_template.jinja (transformers 5).
chatml="{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
cp -r hf4 hf5
python3 - "$chatml" << 'EOF' || bad "crafting the folders failed"
import json, sys
t = json.load(open("hf4/tokenizer.json"))
for i, s in ((256, "<|im_start|>"), (257, "<|im_end|>")):
    t["model"]["vocab"][s] = i
    t["added_tokens"].append({"id": i, "content": s, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
for d in ("hf4", "hf5"):
    json.dump(t, open(d + "/tokenizer.json", "w"))
tc = json.load(open("hf4/tokenizer_config.json"))
tc["chat_template"] = sys.argv[1]
json.dump(tc, open("hf4/tokenizer_config.json", "w"))
open("hf5/chat_template.jinja", "w").write(sys.argv[1])
c = json.load(open("hf5/config.json"))
del c["rope_theta"]
c["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
json.dump(c, open("hf5/config.json", "w"))
EOF
gen() { "$bin/fsdp-generate" --threads 1 "$@"; }
gen --model hf4 --prompt "Hello there" --print-logits > l4.json 2> l4.err || bad "hf4 logits: $(tail -2 l4.err)"
gen --model hf5 --prompt "Hello there" --print-logits > l5.json 2> l5.err || bad "hf5 logits: $(tail -2 l5.err)"
python3 - << 'EOF' && ok || bad "rope_parameters' logits differ from rope_theta's"
import json
a, b = json.load(open("l4.json"))["logits"], json.load(open("l5.json"))["logits"]
d = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
print(f"rope_parameters vs rope_theta: max |logit difference| {d:.3g}")
assert d < 1e-6, d
EOF
# Against rope theta 10000, the logits do differ (the check above can fail).
cp -r hf4 hf10k && sed -i 's/"rope_theta": 500000.0/"rope_theta": 10000.0/; /rope_parameters/,/}/d' hf10k/config.json
python3 -c 'import json; c = json.load(open("hf10k/config.json")); c.pop("rope_parameters", None); c["rope_theta"] = 10000.0; json.dump(c, open("hf10k/config.json", "w"))'
gen --model hf10k --prompt "Hello there" --print-logits > l10k.json 2> /dev/null
cmp -s l4.json l10k.json && bad "rope theta 10000 gives the same logits: the comparison is blind" || ok
cp -r hf5 hfyarn
python3 -c 'import json; c = json.load(open("hfyarn/config.json")); c["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0}; json.dump(c, open("hfyarn/config.json", "w"))'
gen --model hfyarn --prompt "Hi" --print-logits > /dev/null 2> yarn.err && bad "rope_type yarn accepted" || ok
grep -q "rope_parameters.*yarn.*not supported" yarn.err && ok || bad "yarn refusal: $(cat yarn.err)"

# (b) chat_template.jinja is read: --chat on the transformers-5 folder renders ChatML.
gen --model hf5 --chat "Hi" --temperature 0 --tokens 3 > chat5.out 2> chat5.err && ok || bad "--chat on hf5: $(tail -2 chat5.err)"
noleak() { ! grep -qE "check '|failed at|\.cpp:[0-9]" "$1" || bad "$2 shows an internal check: $(cat "$1")"; }
cp -r hf4 hfnone && python3 -c 'import json; c = json.load(open("hfnone/tokenizer_config.json")); del c["chat_template"]; json.dump(c, open("hfnone/tokenizer_config.json", "w"))'
gen --model hfnone --chat "Hi" --tokens 3 > /dev/null 2> none.err && bad "--chat without a template accepted" || ok
grep -q "no chat template" none.err && ok || bad "no-template message: $(cat none.err)"
noleak none.err "--chat without a template" && ok
# ChatML's and Llama 3's words only inside a Jinja comment: the template renders what it writes
# (Jinja2's rendering: a header per turn ending in <|im_end|>, no generation prompt), not ChatML
# nor Llama 3's form.
cp -r hf4 hfllama3 && python3 - << 'EOF'
import json
c = json.load(open("hfllama3/tokenizer_config.json"))
c["chat_template"] = ("{# unlike ChatML's <|im_start|> and <|im_end|>, add_generation_prompt <|im_start|>assistant "
  "message['role'] message['content'], or Llama 3's bos_token, trim and "
  "<|start_header_id|>assistant<|end_header_id|> #}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
  "'<|end_header_id|>\n\n' + message['content'] + '<|im_end|>' }}{% endfor %}")
json.dump(c, open("hfllama3/tokenizer_config.json", "w"))
EOF
gen --model hfllama3 --chat "Hi" --print-logits --logits-rows -1 > llama3.json 2> llama3.err || bad "the header template with a ChatML comment: $(tail -2 llama3.err)"
python3 - << 'EOF' && ok || bad "the header template's prompt is not the text Jinja2 renders"
import json
ids = json.load(open("llama3.json"))["ids"]
want = list("<|start_header_id|>user<|end_header_id|>\n\nHi".encode()) + [257]  # bytes, then <|im_end|>
assert ids == want, (ids, want)
EOF
# ChatML with no <|im_end|> in the vocabulary would never stop: refused.
cp -r hf4 hfnoend && cp hf10k/tokenizer.json hfnoend/ 2> /dev/null
python3 -c 'import json; t = json.load(open("hfnoend/tokenizer.json")); t["model"]["vocab"].pop("<|im_end|>", None); t["added_tokens"] = [a for a in t["added_tokens"] if a["content"] != "<|im_end|>"]; json.dump(t, open("hfnoend/tokenizer.json", "w"))'
gen --model hfnoend --chat "Hi" --tokens 3 > /dev/null 2> noend.err && bad "ChatML without <|im_end|> accepted" || ok
grep -q "<|im_end|>" noend.err && ok || bad "no-<|im_end|> message: $(cat noend.err)"

# A context of 1 position: the KV cache refills with the last token, not with none.
cp -r hf4 hfctx1 && sed -i 's/"max_position_embeddings": 16/"max_position_embeddings": 1/' hfctx1/config.json
gen --model hfctx1 --prompt "Hi" --tokens 4 --temperature 0 > ctx1.out 2> ctx1.err && ok || bad "context 1: $(tail -1 ctx1.err)"

# Sizes whose products overflow 64 bits (2^57) are refused by name, not as a negative tensor size.
for f in --vocab --batch --seq; do
  "$bin/fsdp-train" "${A[@]}" --steps 1 $f 144115188075855872 > huge.out 2>&1 && bad "$f 2^57 accepted" || ok
  grep -q "negative size" huge.out && bad "$f 2^57: $(tail -1 huge.out)" || ok
  grep -q "overflow" huge.out && ok || bad "$f 2^57 message: $(tail -1 huge.out)"
done

# (c) a field of the wrong type names the file and the field.
field_case() {  # field_case FILE PYTHON-EDIT EXPECTED
  rm -rf bad && cp -r hf4 bad
  python3 -c "import json; p = 'bad/$1'; c = json.load(open(p)); $2; json.dump(c, open(p, 'w'))"
  gen --model bad --chat "Hi" --tokens 2 > /dev/null 2> field.err && { bad "$1 $2 accepted"; return; }
  grep -qF "$3" field.err && ok || bad "$1 $2: '$(cat field.err)', expected '$3'"
  noleak field.err "$1 $2" && ok
}
field_case config.json 'c["rms_norm_eps"] = "tiny"' 'config.json: rms_norm_eps: expected a number, got the string "tiny"'
field_case config.json 'c["max_position_embeddings"] = "256"' 'config.json: max_position_embeddings: expected an integer, got the string "256"'
field_case generation_config.json 'c["eos_token_id"] = ["x"]' 'generation_config.json: eos_token_id[0]: expected an integer, got the string "x"'
field_case tokenizer_config.json 'c["bos_token"] = {"content": 5}' 'tokenizer_config.json: bos_token.content: expected a string, got the number 5'
field_case tokenizer_config.json 'c["chat_template"] = [5]' 'tokenizer_config.json: chat_template[0]: expected an object'

# (d) --resume refuses a changed function of the model, and changed data.
"$bin/fsdp-train" "${A[@]}" --steps 3 --ckpt-dir ck --resume --rope-theta 10000 > r1.out 2>&1 && bad "--resume with another --rope-theta continued" || ok
grep -q "rope_theta 500000.0 but this run has rope_theta 10000.0" r1.out && ok || bad "rope theta resume: $(tail -2 r1.out)"
# norm eps comes from --init-from's config.json: a resume from a model with another one is refused.
I=(--init-from hf4 --seq 16 --batch 2 --data text.txt --sample-tokens 0 --threads 1)
"$bin/fsdp-train" "${I[@]}" --steps 1 --ckpt-dir ckinit --ckpt-every 1 > i1.out 2>&1 || bad "--init-from hf4 failed: $(tail -2 i1.out)"
cp -r hf4 hf4eps && sed -i 's/"rms_norm_eps": [0-9.e+-]*/"rms_norm_eps": 1e-05/' hf4eps/config.json
"$bin/fsdp-train" "${I[@]/hf4/hf4eps}" --steps 2 --ckpt-dir ckinit --resume > r2.out 2>&1 && bad "--resume with another norm eps continued" || ok
grep -q "norm_eps" r2.out && ok || bad "norm eps resume: $(tail -2 r2.out)"
head -c 281000 /dev/urandom | base64 -w 80 | head -c 281000 > big.txt
B=("${A[@]/text.txt/big.txt}")
"$bin/fsdp-train" "${B[@]}" --steps 1 --ckpt-dir ckbig --ckpt-every 1 > big1.out 2>&1 || bad "big data run failed: $(tail -2 big1.out)"
head -c 5000 /dev/zero | tr '\0' 'x' | dd of=big.txt bs=1 seek=8000 conv=notrunc status=none
"$bin/fsdp-train" "${B[@]}" --steps 2 --ckpt-dir ckbig --resume > big2.out 2>&1 && bad "data changed at offset 8000 resumed" || ok
grep -q "was trained on other data" big2.out && ok || bad "changed data message: $(tail -2 big2.out)"
summary
