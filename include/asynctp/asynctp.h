// asynctp: asynchronous tensor parallelism. The one header C++ users include: tensors, groups
// (and their stores), contexts, the ops and the errors. C users include asynctp_c.h instead.
#pragma once

#include <asynctp/context.h>
#include <asynctp/dims.h>
#include <asynctp/dtype.h>
#include <asynctp/errors.h>
#include <asynctp/group.h>
#include <asynctp/ops.h>
#include <asynctp/store.h>
#include <asynctp/tensor.h>
