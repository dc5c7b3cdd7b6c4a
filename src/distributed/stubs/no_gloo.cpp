// The Gloo engine in a build without Gloo (FSDP_GLOO=OFF or no Gloo found):
// asking for it throws, naming the option.
#include <memory>
#include <string>

#include "fsdp/core/error.h"
#include "src/distributed/transport.h"

namespace fsdp::dist {

std::unique_ptr<Transport> make_gloo_transport(std::shared_ptr<TCPStore> /*store*/, int /*rank*/,
                                           int /*size*/, const std::string& /*hostname*/) {
  FSDP_FAIL(
      "[init_process_group] backend gloo requested but fsdp.cpp was built without Gloo "
      "(FSDP_GLOO=OFF, or no Gloo found at configure time)");
}

}  // namespace fsdp::dist
