// fsdp::data::jinja::Template: parses once (jinja_parse.cpp), renders per call with a fresh
// Evaluator (jinja_eval.cpp), so one Template renders from many threads at once.
#include "fsdp/data/jinja.h"

#include "fsdp/core/error.h"
#include "jinja_impl.h"

namespace fsdp::data::jinja {

Template::Template(const std::string& source, std::string name, Limits limits) {
  auto p = std::make_shared<Program>();
  p->name = std::move(name);
  p->limits = limits;
  parse_template(source, *p);
  program_ = std::move(p);
}

Rendered Template::render(const nlohmann::ordered_json& context) const {
  Evaluator ev(*program_, context);
  return ev.run();
}

bool Template::has_generation_blocks() const { return program_->has_generation; }

const std::string& Template::name() const { return program_->name; }

}  // namespace fsdp::data::jinja
