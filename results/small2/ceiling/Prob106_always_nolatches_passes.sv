module tb;
  reg [15:0] scancode; wire left, down, right, up;
  TopModule dut(.scancode(scancode), .left(left), .down(down), .right(right), .up(up));
  initial begin
    scancode = 16'h0000; #1; scancode = 16'hffff; #1; scancode = 16'h0000; #1;
    scancode = 16'he06b; #1; scancode = 16'h0; #1; scancode = 16'he072; #1; scancode = 16'h0; #1;
    scancode = 16'he074; #1; scancode = 16'h0; #1; scancode = 16'he075; #1; scancode = 16'h0; #1;
    $finish;
  end
endmodule
