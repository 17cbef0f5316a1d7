module tb;
  reg [7:0] addr; wire [15:0] dout;
  ROM rom_inst(.addr(addr), .dout(dout));
  integer i;
  initial begin
    for (i = 0; i < 600; i = i + 1) begin addr = i[7:0]; #1; end
    for (i = 0; i < 40; i = i + 1) begin addr = i % 4; #1; addr = 3 - (i % 4); #1; end
    $finish;
  end
endmodule
