// Which files a data spec names, and what they are (private to src/data): llm.c's shard format
// (its magics and header), a spec's shard files in stream order, and the check that refuses a
// FIFO, a device or a socket by name before anything opens it. The token sources
// (token_sources.cpp, bin_shards.cpp) and data_identity (data_files.cpp) read files only through
// these, so they agree on what a spec means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

constexpr int32_t kShardMagic = 20240520;    // llm.c GPT-2: version 1, uint16 tokens
constexpr int32_t kShardMagic32 = 20240801;  // llm.c Llama 3: version 7, uint32 tokens
constexpr int64_t kHeaderBytes = 256 * 4;
constexpr uintptr_t kMapBlockBytes = 2 << 20;  // the largest folio a fault may map (a PMD)

// A data file must be a regular file: a FIFO, a device or a socket is refused by name before it is
// opened (--data /dev/zero read forever while memory grew; opening a FIFO blocks).
void check_regular_file(const std::string& path);

// Whether the file starts with one of llm.c's shard magics.
bool has_shard_magic(const std::string& path);

// Whether `spec` names llm.c shards: a directory, a glob, or a file that is a shard by its magic
// or its .bin name (a .bin file with a bad magic is refused by the shard reader, never read as
// bytes).
bool names_shards(const std::string& spec);

// Whether `spec` is a JSONL file of samples, by its content: a .jsonl name (any case), or a
// regular file whose first line is a JSON object naming "messages" or "input_ids" (a .json or
// .txt file of chats too: they used to be trained on as raw text, JSON syntax included). A .json
// file (any case) of another form is refused naming the form --data takes. Its lines are parsed,
// and refused by line, by the sample reader (open_jsonl_samples).
bool names_jsonl_samples(const std::string& spec);

// The files `spec` names (a directory's *.bin, a glob's matches, or the one file), checked to be
// regular files, in name order: the stream order.
std::vector<std::string> shard_files(const std::string& spec);

}  // namespace fsdp::data
