# The system (Debian) packages scalesweep builds against, checked before any layer so that a
# missing one fails the configure step (and so `pip install .`) with a message naming the
# package, instead of a compile error deep in the build. scripts/setup.sh installs them all.
#
# ss_require_header(HEADER DEBIAN_PACKAGE [PATH_SUFFIXES...])
function(ss_require_header header package)
  string(MAKE_C_IDENTIFIER "SS_HDR_${header}" var)
  find_path(${var} ${header} PATH_SUFFIXES ${ARGN})
  if(NOT ${var})
    message(FATAL_ERROR
            "scalesweep: ${header} not found: install the Debian package ${package} "
            "(apt-get install ${package}; scripts/setup.sh installs every dependency)")
  endif()
endfunction()

ss_require_header(CLI/CLI.hpp libcli11-dev)
ss_require_header(nlohmann/json.hpp nlohmann-json3-dev)
ss_require_header(hwy/highway.h libhwy-dev)
ss_require_header(cblas.h libopenblas-dev openblas openblas-pthread
                  x86_64-linux-gnu/openblas-pthread)
ss_require_header(lapacke.h liblapacke-dev)
# libdnnl-dev (oneDNN, the bf16 compute mode) is optional: src/model/layer.cmake reports it.
