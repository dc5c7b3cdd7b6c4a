// A run's config as a TOML file (fsdp-train --config FILE), keyed like TrainOptions:
//
//   version = 1                  # the config's format; 1 is the only one so far
//   include = "base.toml"        # read first, relative to this file (or a list of files)
//   [model]
//   preset = "tiny"
//   dim = 576
//   [optimizer]
//   lr = 2e-5
//
// Each [section] and key is a section and field of flags.def (so the command line's --grad-clip
// is [optimizer] grad_clip), read as the command line reads it (train::set_flag). An unknown
// section or key is refused by name with the nearest known one; an include cycle is refused
// naming the chain. Read with toml++ (Debian's libtomlplusplus-dev); a build without it refuses
// --config by name.
#pragma once

#include <string>

#include "fsdp/train/options.h"

namespace fsdp::train {

// Sets o's flags from the TOML file at path (its includes first). Throws naming the file, the
// line and the key.
void load_config_file(TrainOptions& o, const std::string& path);

// Every flag of o as a version-1 TOML config (an unset optional as a comment): what
// --print-config prints, and what load_config_file reads back to the same options.
std::string config_toml(const TrainOptions& o);

// --resume --ckpt-dir DIR with no other flag: sets o's flags from the newest complete
// checkpoint in dir (the flags its run was started with, saved in its metadata) and returns its
// path, or "" when dir holds none. A flag this fsdp-train no longer knows is skipped with a note
// on stderr.
std::string apply_checkpoint_flags(TrainOptions& o, const std::string& ckpt_dir);

// Whether this build reads TOML (toml++ was found).
bool config_files_supported();

}  // namespace fsdp::train
