# Layer `io` extras. Optional: Parquet and Arrow input for io::read_documents (eval_data.h)
# through the Arrow/Parquet C++ libraries that the pyarrow wheel ships with their headers
# (Debian 12 packages no libarrow-dev). SS_ARROW=AUTO turns it on when python3 imports pyarrow
# and a test program compiles and links against them; the binaries then carry an RPATH to
# pyarrow's folder. Off for `pip install .` (SKBUILD) in AUTO: an installed package should not
# depend on the path of another package's site-packages. Without it, read_documents reads JSONL
# and refuses Parquet/Arrow with a message (scripts/eval_data.py convert writes JSONL).
set(SS_ARROW "AUTO" CACHE STRING "Read Parquet/Arrow eval data with pyarrow's C++ libraries: AUTO, ON, OFF")
set(ss_arrow_ok FALSE)
if(SS_ARROW STREQUAL "ON" OR (SS_ARROW STREQUAL "AUTO" AND NOT SKBUILD))
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
              "import pyarrow as pa; print(pa.get_include()); print(pa.get_library_dirs()[0]); print(pa.cpp_build_info.so_version)"
      OUTPUT_VARIABLE ss_pa_out RESULT_VARIABLE ss_pa_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(ss_pa_rc EQUAL 0)
      string(REPLACE "\n" ";" ss_pa_out "${ss_pa_out}")
      list(GET ss_pa_out 0 SS_ARROW_INCLUDE)
      list(GET ss_pa_out 1 ss_pa_libdir)
      list(GET ss_pa_out 2 ss_pa_so)
      set(SS_ARROW_LIBS ${ss_pa_libdir}/libparquet.so.${ss_pa_so} ${ss_pa_libdir}/libarrow.so.${ss_pa_so})
      if(EXISTS ${ss_pa_libdir}/libarrow.so.${ss_pa_so} AND EXISTS ${ss_pa_libdir}/libparquet.so.${ss_pa_so})
        # Cached by CMake per build folder; the probe reads a Parquet footer to need both libraries.
        unset(SS_ARROW_LINKS CACHE)  # probe again at each configure: pyarrow may have changed
        try_compile(SS_ARROW_LINKS
          SOURCE_FROM_CONTENT ss_arrow_probe.cc [=[
#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
int main() {
  auto buf = std::make_shared<arrow::io::BufferReader>(std::make_shared<arrow::Buffer>(nullptr, 0));
  auto r = parquet::arrow::OpenFile(buf, arrow::default_memory_pool());
  return r.ok() ? 1 : 0;
}
]=]
          CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${SS_ARROW_INCLUDE}"
          LINK_LIBRARIES ${SS_ARROW_LIBS}
          CXX_STANDARD 20
          OUTPUT_VARIABLE ss_arrow_probe_log)
        if(SS_ARROW_LINKS)
          set(ss_arrow_ok TRUE)
        endif()
      endif()
    endif()
  endif()
  if(ss_arrow_ok)
    message(STATUS "pyarrow ${ss_pa_so} (${ss_pa_libdir}): io::read_documents reads Parquet and Arrow")
    # Only eval_data.cc sees Arrow (its headers as system headers: their warnings are theirs).
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/io/eval_data.cc TARGET_DIRECTORY ss_io
      PROPERTIES COMPILE_DEFINITIONS SS_HAVE_ARROW=1 COMPILE_OPTIONS "-isystem;${SS_ARROW_INCLUDE}")
    # --as-needed: a binary that never calls read_documents on Arrow does not load libarrow
    # (its start-up costs about 50 ms). The feature variables live in the top directory scope.
    set(CMAKE_LINK_LIBRARY_USING_SS_AS_NEEDED "LINKER:--push-state,--as-needed" "<LINK_ITEM>"
        "LINKER:--pop-state" PARENT_SCOPE)
    set(CMAKE_LINK_LIBRARY_USING_SS_AS_NEEDED_SUPPORTED TRUE PARENT_SCOPE)
    target_link_libraries(ss_io PRIVATE "$<LINK_LIBRARY:SS_AS_NEEDED,${SS_ARROW_LIBS}>")
  elseif(SS_ARROW STREQUAL "ON")
    message(FATAL_ERROR "SS_ARROW=ON: pyarrow's C++ libraries not usable (python3 -m pip install "
                        "pyarrow; the probe log is in CMakeFiles/CMakeConfigureLog.yaml)")
  else()
    message(STATUS "pyarrow not found or not linkable: io::read_documents reads JSONL only "
                   "(install pyarrow and reconfigure for Parquet/Arrow)")
  endif()
endif()
