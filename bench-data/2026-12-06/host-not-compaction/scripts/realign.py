"""Copy a gguf with another data alignment (the tensors' bytes unchanged)."""
import sys
import gguf
from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

src, dst, align = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = gguf.GGUFReader(src, "r")
arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
writer.add_custom_alignment(align)
copy_with_new_metadata(reader, writer, {}, [gguf.Keys.General.ALIGNMENT])
r = gguf.GGUFReader(dst)
print(dst, r.alignment, sorted({t.data_offset % 4096 % align for t in r.tensors}), {t.data_offset % 64 for t in r.tensors})
