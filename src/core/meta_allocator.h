// The meta device's allocator (src/core/meta.cpp), for allocator_for. Private to the library.
#pragma once

#include "fsdp/core/allocator.h"

namespace fsdp {

Allocator& meta_allocator();

}  // namespace fsdp
