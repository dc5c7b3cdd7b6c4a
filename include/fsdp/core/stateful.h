// A part of a run whose state a checkpoint carries beside the model's and the optimizer's sharded
// tensors, as torch.distributed.checkpoint's Stateful: a data loader's position, a trainer's own
// counters. Its state is one small JSON value, the same on every rank; checkpoint::Manager saves
// each part under its name (metadata.json's "user" object) and hands it back on resume:
//
//   checkpoint::RunState run{.model = root, .optimizer = opt, .parts = {{"data", &loader}}};
//   manager.load(run);          // every part's state restored, or a refusal that names it
//   manager.save(step, run);
#pragma once

#include <string>

namespace fsdp {

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The part's state as JSON text (an object, a number...).
  virtual std::string state_dict() const = 0;
  // Restores a state that state_dict() gave (at any world size). `where` names the file and the
  // field it came from ("D/step_00000010/metadata.json: user.data"), for the error when it is not
  // one: throws fsdp::Error naming `where` and what was expected.
  virtual void load_state_dict(const std::string& state, const std::string& where) = 0;
};

}  // namespace fsdp
