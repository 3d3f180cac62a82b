# The seed corpus folders of each fuzz target (sourced by replay.sh and scripts/fuzz.sh): its own
# fuzz/corpus/<target>/ where it has one, and the inputs it shares with other targets, so that no
# kernel is kept twice. The verifier reads assembly and binaries alike (by the magic).
#   seed_dirs ROOT TARGET   prints the folders, one per line
seed_dirs() {
  local root="$1"
  case "$2" in
    assembler) printf '%s\n' "$root/fuzz/corpus/assembler" "$root/kernels" ;;
    verifier) printf '%s\n' "$root/fuzz/corpus/assembler" "$root/fuzz/corpus/kernel_file" \
                "$root/kernels" ;;
    *) printf '%s\n' "$root/fuzz/corpus/$2" ;;
  esac
}
