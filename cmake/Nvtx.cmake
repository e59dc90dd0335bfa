# Decides whether the ops carry NVTX ranges and the streams NVTX names (src/device/nvtx.h). NVTX v3
# is header-only (the CUDA toolkit ships it as include/nvtx3) and loads a tool's library only
# where one is named, so it costs nothing unprofiled and needs no CUDA: a CPU build with the
# headers carries the ranges too (nsys traces NVTX in CPU-only processes). AUTO annotates where
# the headers are found, ON requires them, OFF builds the annotations as no-ops.
set(ASYNCTP_WITH_NVTX "AUTO" CACHE STRING "Annotate the ops with NVTX ranges (AUTO, ON, OFF)")
set_property(CACHE ASYNCTP_WITH_NVTX PROPERTY STRINGS AUTO ON OFF)
set(ASYNCTP_NVTX_ENABLED OFF)
if(NOT ASYNCTP_WITH_NVTX STREQUAL "OFF")
  find_path(ASYNCTP_NVTX_INCLUDE_DIR nvtx3/nvToolsExt.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDA_HOME ENV CUDA_PATH
            PATHS /usr/local/cuda
            PATH_SUFFIXES include)
  if(ASYNCTP_NVTX_INCLUDE_DIR)
    set(ASYNCTP_NVTX_ENABLED ON)
  elseif(ASYNCTP_WITH_NVTX STREQUAL "ON")
    message(FATAL_ERROR "ASYNCTP_WITH_NVTX=ON but nvtx3/nvToolsExt.h was not found "
                        "(set ASYNCTP_NVTX_INCLUDE_DIR to the directory that holds nvtx3/)")
  endif()
endif()
