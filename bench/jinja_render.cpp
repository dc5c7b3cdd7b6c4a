// fsdp-bench-jinja: the chat-template engine's throughput. Renders N generated conversations
// (a system turn or none, 1 to 6 turns, 20 to 400 characters a message, tools on every fourth)
// with one template, one thread, and prints the time, conversations per second and MB/s of text.
//   fsdp-bench-jinja TEMPLATE.jinja [N=10000]
// The issue's target: Qwen3's template (llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja, which
// scripts/install-deps.sh unpacks into build/_deps/llama-templates) under a second for 10,000.
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fsdp/data/jinja.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: fsdp-bench-jinja TEMPLATE.jinja [N]\n");
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  if (!f) {
    fmt::print(stderr, "fsdp-bench-jinja: cannot read {}\n", argv[1]);
    return 1;
  }
  const std::string source((std::istreambuf_iterator<char>(f)), {});
  const int n = argc > 2 ? std::atoi(argv[2]) : 10000;
  using json = nlohmann::ordered_json;
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather in a city.", "parameters": {"type": "object", "properties": {"city":
      {"type": "string", "description": "The city"}}, "required": ["city"]}}}])");
  std::mt19937 rng(1234);
  const std::string words = "the quick brown fox jumps over the lazy dog; café 日本語 🎉 {{ x }} <|im_end|> ";
  auto text = [&] {
    std::string s;
    const size_t len = 20 + rng() % 380;
    while (s.size() < len) s += words.substr(rng() % 40, 8);
    return s;
  };
  std::vector<json> chats;
  for (int i = 0; i < n; ++i) {
    json msgs = json::array();
    if (rng() % 2) msgs.push_back({{"role", "system"}, {"content", text()}});
    const int turns = 1 + int(rng() % 6);
    for (int t = 0; t < turns; ++t) msgs.push_back({{"role", t % 2 ? "assistant" : "user"}, {"content", text()}});
    chats.push_back({{"messages", msgs},
                     {"tools", i % 4 == 0 ? tools : json(nullptr)},
                     {"documents", nullptr},
                     {"add_generation_prompt", msgs.back()["role"] == "user"}});
  }
  try {
    const fsdp::data::jinja::Template tmpl(source, argv[1]);
    const auto t0 = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (const auto& c : chats) bytes += tmpl.render(c).text.size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("rendered {} conversations with {} in {:.3f} s: {:.0f} conversations/s, {:.1f} MB/s of text\n", n,
               argv[1], s, n / s, bytes / s / 1e6);
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-bench-jinja: {}\n", e.what());
    return 1;
  }
  return 0;
}
