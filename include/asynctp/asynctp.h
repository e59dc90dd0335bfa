// asynctp: asynchronous tensor parallelism. The one header users include.
#pragma once

#include <asynctp/group.h>
#include <asynctp/tensor.h>
#include "core/buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/backend.h"
#include "ops/collectives.h"
#include "ops/context.h"
#include "ops/fused_matmul.h"
#include "runtime/launcher.h"
#include "symm/symmetric_memory.h"
