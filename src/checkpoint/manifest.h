// A checkpoint folder's manifest (metadata.json) and its seal (complete.json), read and checked
// whole by every reader (resume's load, fsdp-export's consolidate, the extra-file reader) before
// any tensor byte is read, so that all of them refuse the same things in the same words.
//
// The seal: rank 0 writes metadata.json, then complete.json (the manifest's checksum, the run
// id, the step) last, inside the .tmp_ folder, then renames the folder. A folder without a valid
// complete.json, or whose metadata.json no longer has the recorded checksum, is incomplete: it is
// not loaded, and the reason is said. Checkpoints written before the seal (format 1) are read
// with a note: their files' checksums, chunks and shard numbers are checked, but a changed
// metadata.json cannot be told from the original; a shard that names a run (written after the
// seal existed) in a format-1 folder is refused (a seal removed by hand).
//
// The checks (check_manifest): every tensor's chunks are exactly one per shard, none negative,
// and, taken by first row, each starting where the one before ended and together covering the
// tensor's rows (expert parallel's shards hold their experts' rows out of shard order); the shard files present are exactly shard_00000..shard_{shards-1}. Each shard file
// (open_shard): its checksum, then its safetensors header's identity (shard number, shard count,
// writing rank, world size, run id, step) against the manifest, then every tensor's shape against
// its chunk.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/tensor.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/fully_shard.h"

namespace fsdp::checkpoint::detail {

inline constexpr const char* kFormat = "fsdp.cpp-checkpoint/2";
inline constexpr const char* kFormatUnsealed = "fsdp.cpp-checkpoint/1";  // before complete.json
inline constexpr const char* kCompleteFile = "complete.json";
// Written into D/.tmp_step_N as it is created (and removed once complete.json seals it): an
// unfinished write carries the project's mark too, so --overwrite and a later save remove only
// .tmp_step_ folders this project made, never a user's folder of that name.
inline constexpr const char* kWritingFile = ".fsdp_checkpoint_writing";

std::string shard_file(int shard);  // "shard_00003.safetensors"

struct Chunk {
  int64_t begin = 0, rows = 0;
};

struct TensorEntry {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<Chunk> chunks;  // one per shard, in shard order (their rows in any order)
};

struct Manifest {
  std::string dir;
  bool sealed = true;   // format 2 with its complete record; false: format 1, read with a note
  nlohmann::json meta;  // the whole metadata.json
  int64_t step = 0;
  int shards = 0;
  int world_size = -1;  // -1: not recorded (format 1)
  std::string run_id;   // "": none recorded
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> checksums;  // file name -> checksum
};

// complete.json's contents for a manifest of these bytes.
std::string complete_record(const std::string& metadata_bytes, const std::string& run_id,
                            int64_t step);

// Reads dir/metadata.json, checks its seal and every field; throws naming the file and the field.
Manifest read_manifest(const std::string& dir);

// Each of `infos`'s chunks, one per shard, as the shards hold them: every rank's (shard, first
// row, rows), all-gathered over `world` (null: one rank). A part of a global tensor (a parameter
// that carries a placement: expert parallel's experts, a tensor-parallel weight) starts where its
// layout puts it, which the shard count alone does not say. dedupe (a shard per rank, ranks that
// hold the same rows: the tp replicas of a parameter sharded over dp only): a chunk equal to a
// lower shard's becomes empty, so each row is saved once; chunks that overlap otherwise are
// refused. Collective over `world`.
std::vector<std::vector<Chunk>> shard_chunks(const std::vector<FSDPModule::ShardInfo>& infos,
                                             int shard, int shards,
                                             const std::shared_ptr<dist::ProcessGroup>& world,
                                             bool dedupe = false);

// Opens shard s of a checked manifest: the file's checksum, its header's identity and its
// tensors' shapes, checked against the manifest.
std::unique_ptr<SafetensorsIndex> open_shard(const Manifest& m, int s);

// Refuses a checkpoint tensor that holds NaN or Inf, naming the file and the tensor: a resume
// went on to a NaN loss that blamed the learning rate, and an export merged a NaN adapter into
// thousands of NaN weights with rc 0. `t` is a host tensor of any float dtype.
void check_finite(const Tensor& t, const std::string& file, const std::string& name);

}  // namespace fsdp::checkpoint::detail
